"""What the views share: how errors reach the user, and how figures are written."""

import functools
import secrets
import sys
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import gradio as gr

from store import StoreError
from store.db import NotSaved
from train.common.errors import ModelError
from ui.owner.auth import WeakPassword
from ui.owner.jobs import JobError
from ui.owner.server import Refused

# The settings of an operator view's events: kept out of the API page (tests and scripts may still
# call them by name), and a refresh shows no spinner.
QUIET = dict(api_visibility="undocumented", show_progress="hidden")


LOGGED_CHARACTERS = 300  # of a refusal's reason: a caller's input in it must not flood the log


def refused(message: str) -> gr.Error:
    """A message for the user that is not a fault of the server: logged in one line (log_refusal), without a traceback."""
    return gr.Error(message, print_exception=False)


def whole_number(value: Any) -> int | None:
    """`value` as a whole number 0 or more, or None where it is none: a number field can send anything."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 and value == int(value):
        return int(value)
    return None


def log_refusal(call: str, reason: str) -> None:
    """One line in the server's log for a refused call: the caller's text in it can start no line of its own."""
    reason = " ".join(str(reason).split())
    print(f"refused {call}: {reason[:LOGGED_CHARACTERS]}", file=sys.stderr, flush=True)


def with_error_ids(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A refusal reaches the user as its reason and the log as one line; an unexpected error reaches the user as a
    short message with an id, and its details go to the server log under that id."""

    @functools.wraps(handler)  # Gradio reads the handler's signature for its gr.Request parameter
    def reported(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except gr.Error as e:
            log_refusal(handler.__name__, e.message)
            raise
        except Refused as e:
            log_refusal(handler.__name__, str(e))
            raise refused(str(e)) from None
        except Exception as e:
            error_id = secrets.token_hex(4)
            print(f"error {error_id} in {handler.__name__}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            if isinstance(e, NotSaved):  # a full disk, most often: the user should know nothing was recorded
                raise refused(f"The server could not save this, so nothing of it was recorded (error {error_id}). "
                              "Try again in a minute; if it goes on, give your operator this error id.") from None
            raise refused(f"Something went wrong on the server (error {error_id}). Try again; if it goes on, "
                          "give your operator this error id.") from None

    return reported


@contextmanager
def user_errors() -> Iterator[None]:
    """Show Tether's own errors (bad input, a model that won't load) as messages, not crashes."""
    try:
        yield
    except NotSaved:
        raise  # not the user's input: reported by id
    except (StoreError, ModelError, JobError, WeakPassword) as e:
        raise refused(str(e)) from None


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def progress_bar(progress: float, width: int = 20) -> str:
    filled = round(progress * width)
    return "█" * filled + "░" * (width - filled) + f" {progress:.0%}"


def figure(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0%}" if percent else f"{value:.3f}"
