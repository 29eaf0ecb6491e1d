"""The annotation side: building pairs, the queue's settings, agreement, ratings, export, and simulated annotators with their judges."""
