"""Judges for simulated annotators: `judge(prompt, completion) -> float`, higher is better.

A simulated annotator prefers A over B with probability sigmoid((judge(A) - judge(B)) / T),
so a judge's scale matters only against the noise T. The built-in ones are simple on purpose:
they give the loop a target whose progress is easy to see and to check. Their units are set so
that T = 1 is a noisy annotator, not a coin: ten words for `concise`, and one percentage point of
the answer's words for the ones that measure a density. All but `concise` are length-neutral: a
density over at least 20 words, so an answer said twice scores as once, padding dilutes it, and
a bare fragment cannot win.
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


# Words too common in questions to say what one is about.
QUESTION_WORDS = frozenset(
    "about after also been before being between both could does doing each explain describe from have into just like "
    "make more most much only other over same should some such than that their them then there these they this those "
    "through very what when where which while with would your yours give tell write please list short brief help want "
    "need know".split()
)
STEP_WORDS = frozenset("first second third fourth fifth firstly secondly thirdly finally step steps".split())
HEDGES = frozenset(
    "maybe perhaps possibly probably might unsure depends depending generally usually typically somewhat arguably "
    "sorry cannot can't unable apologize apologise unfortunately".split()
)
OPENING = 20  # words: where a direct answer already says what matters


def direct(prompt: str, completion: str) -> float:
    """Direct, concrete answers: the question's own key words, numbers and steps, minus hedges and refusals.

    In percent of the answer's words (at least 20), averaged with the same count in percent of its
    opening 20 words, so saying it early counts as much as the whole rest. One such word more in a
    100-word answer's body is half a unit, in its opening three units. Key words are the prompt's
    words of four letters or more, matched on their first five letters ("boil" finds "boiling").
    """
    keys = {w[:5] for w in WORD.findall(prompt.lower()) if len(w) >= 4 and w not in QUESTION_WORDS}
    values = [_directness(token, keys) for token in TOKEN.findall(completion)]
    bullets = len(re.findall(r"^\s*[-*•]\s", completion, re.MULTILINE))  # list items are steps too
    whole = (sum(values) + bullets) / max(len(values), OPENING)
    opening = sum(values[:OPENING]) / OPENING
    return 100 * (whole + opening) / 2


def _directness(token: str, keys: set[str]) -> int:
    word = token.lower()
    if token[0].isdigit() or word in STEP_WORDS or (len(word) >= 4 and word[:5] in keys):
        return 1
    return -1 if word in HEDGES else 0


COURTESY = frozenset("please thank thanks welcome glad appreciate kindly hope gladly pleasure grateful sincerely".split())
READER = frozenset("you your yours yourself you're you'll you've you'd".split())
DISMISSIVE = frozenset(
    "stupid dumb idiot idiotic obviously whatever nonsense ridiculous pathetic lazy shut damn crap duh silly".split()
)


def polite(prompt: str, completion: str) -> float:
    """Tone: a courteous register that speaks to the reader (please, thank you, hope, you and your), minus
    dismissive or rude words, in percent of the answer's words (at least 20).

    It judges how an answer speaks, not what it says: one such word more in a 100-word answer is one unit.
    """
    words = WORD.findall(completion.lower())
    warm = sum(w in COURTESY or w in READER for w in words)
    return 100 * (warm - sum(w in DISMISSIVE for w in words)) / max(len(words), 20)


BUILT_IN: dict[str, Judge] = {"concise": concise, "positive": positive, "specific": specific, "direct": direct, "polite": polite}


class JudgeError(Exception):
    """A judge that cannot be loaded, said in one line."""


def load_judge(spec: str) -> Judge:
    """A judge by name: a built-in one (BUILT_IN), `module:FUNC` or `PATH.py:FUNC`."""
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
