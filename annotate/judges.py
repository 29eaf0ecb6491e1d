"""Judges for simulated annotators: `judge(prompt, completion) -> float`, higher is better.

A simulated annotator prefers A over B with probability sigmoid((judge(A) - judge(B)) / T),
so a judge's scale matters only against the noise T. The built-in ones are simple on purpose:
they give the loop a target whose progress is easy to see and to check. Their units are set so
that T = 1 is a noisy annotator, not a coin: ten words for `concise`, and one percentage point of
the answer's words for the two that measure a density.
"""

import importlib
import importlib.util
import math
import random
import re
from pathlib import Path
from typing import Callable

Judge = Callable[[str, str], float]

WORD = re.compile(r"[a-z']+")
POSITIVE = frozenset(
    "good great excellent wonderful happy glad love lovely beautiful best enjoy delightful fantastic amazing "
    "kind helpful pleasant joy joyful nice brilliant awesome cheerful grateful thanks thank calm bright hope".split()
)
NEGATIVE = frozenset(
    "bad terrible awful horrible sad hate ugly worst boring angry annoying poor wrong sorry fail failure "
    "painful nasty disgusting dreadful miserable unhappy fear afraid dull gloomy".split()
)


def concise(prompt: str, completion: str) -> float:
    """Shorter answers score higher: minus the number of words, in tens (an empty answer scores -5)."""
    words = len(completion.split())
    return -5.0 if words == 0 else -words / 10


def positive(prompt: str, completion: str) -> float:
    """Sentiment: positive words minus negative ones, in percent of the answer's words (at least 20)."""
    words = WORD.findall(completion.lower())
    return 100 * (sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)) / max(len(words), 20)


TOKEN = re.compile(r"\d+(?:[.,:]\d+)*%?|[A-Za-z][A-Za-z'-]*")
EXAMPLES = frozenset("example examples instance e.g such".split())
VAGUE = frozenset(
    "thing things stuff various many some several generally usually often maybe perhaps possibly depends etc "
    "something somewhat kind sort basically really very lot lots".split()
)


def specific(prompt: str, completion: str) -> float:
    """Concrete content: numbers, names mid-sentence and worked examples, minus vague filler, in percent of
    the answer's words.

    The density is taken over at least 20 words, so neither padding nor a bare "7." wins: it
    rewards what an answer says, not how long it is.
    """
    concrete = vague = words = 0
    for match in TOKEN.finditer(completion):
        token = match.group()
        words += 1
        before = completion[: match.start()].rstrip()
        mid_sentence = bool(before) and before[-1] not in ".!?:\n\"*-"
        if token[0].isdigit() or token.lower() in EXAMPLES or (mid_sentence and token[0].isupper() and token != "I"):
            concrete += 1
        elif token.lower() in VAGUE:
            vague += 1
    return 100 * (concrete - vague) / max(words, 20)


BUILT_IN: dict[str, Judge] = {"concise": concise, "positive": positive, "specific": specific}


class JudgeError(Exception):
    """A judge that cannot be loaded, said in one line."""


def load_judge(spec: str) -> Judge:
    """A judge by name: a built-in one ('concise', 'positive'), `module:FUNC` or `PATH.py:FUNC`."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    source, _, name = spec.rpartition(":")
    if not source or not name:
        raise JudgeError(f"judge {spec!r}: expected one of {', '.join(BUILT_IN)}, module:FUNC or PATH.py:FUNC")
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise JudgeError(f"judge {spec!r}: {path} is not a file")
        module_spec = importlib.util.spec_from_file_location(f"tether_judge_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:  # the user's file: any error in it is theirs to see, in one line
            raise JudgeError(f"judge {spec!r}: {path} failed to load: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(source)
        except ImportError as e:
            raise JudgeError(f"judge {spec!r}: cannot import {source}: {e}") from None
    judge = getattr(module, name, None)
    if not callable(judge):
        raise JudgeError(f"judge {spec!r}: {source} has no function {name}")
    return judge


def prefers_first(margin: float, noise: float, rng: random.Random) -> bool:
    """A noisy annotator's choice, given the judge's margin judge(first) - judge(second): the first with
    probability sigmoid(margin / noise). noise 0 is a perfect annotator (a tie in score is a coin flip)."""
    if noise == 0:
        return margin > 0 or (margin == 0 and rng.random() < 0.5)
    return rng.random() < sigmoid(margin / noise)


def sigmoid(z: float) -> float:
    if z >= 0:  # two forms, so that exp never overflows
        return 1 / (1 + math.exp(-z))
    return math.exp(z) / (1 + math.exp(z))
