"""What the views share: how errors reach the user, and how figures are written."""

import functools
import inspect
import secrets
import sys
import traceback
import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Union, get_args, get_origin

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
    """`value` as a whole number 0 or more that the database holds (64 bits), or None where it is none: a number field
    can send anything."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 2**63 and value == int(value):
        return int(value)
    return None


# The JSON a handler's parameter annotated with each type takes, where it is not that type alone: a float takes an int,
# and bool is no int here, nor 1 a bool.
JSON_TAKEN = {float: (int, float), int: (int,)}
JSON_NAMES = {str: "text", int: "a whole number", float: "a number", bool: "true or false", type(None): "null", list: "a list",
              dict: "an object"}


def takes(annotation: Any, value: Any) -> bool:
    """Whether a JSON value is of the type a handler's parameter is annotated with: str, int, float, bool, None, dict,
    a list of one of them, or a union of them. An unannotated parameter takes anything."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        return any(takes(member, value) for member in get_args(annotation))
    if get_origin(annotation) is list:
        return isinstance(value, list) and all(takes(get_args(annotation)[0], item) for item in value)
    return type(value) in JSON_TAKEN.get(annotation, (annotation,))


def described(annotation: Any) -> str:
    if get_origin(annotation) in (Union, types.UnionType):
        return " or ".join(described(member) for member in get_args(annotation))
    if get_origin(annotation) is list:
        return f"a list of {described(get_args(annotation)[0])}"
    return JSON_NAMES.get(annotation, annotation.__name__)


def wrong_input(handler: Callable[..., Any], inputs: list, components: list) -> str | None:
    """Why a call's inputs, as sent, are not of the types its handler's parameters are annotated with, naming the first
    that is not; None where each is. Gradio hands most inputs to the handler as they came (a textbox's any JSON but
    null as text). Its files it checks itself against their data model, and a State's value comes from the session."""
    parameters = [p for p in inspect.signature(handler, eval_str=True).parameters.values()
                  if not getattr(p.annotation, "__module__", "").startswith("gradio")]  # gr.Request and the like: Gradio fills them
    for parameter, component, value in zip(parameters, components, inputs):
        if getattr(component, "data_model", None) is None and not component.stateful and not takes(parameter.annotation, value):
            return f"{parameter.name} must be {described(parameter.annotation)}, not {JSON_NAMES.get(type(value), type(value).__name__)}"
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
