"""Models: loading, generation, reward-model training, PPO, and the job worker that runs them in one process or several.

This package reads and writes files; it never opens the database.
"""
