"""Judges for simulated annotators, and the noisy choice they drive."""

import random

import pytest

from annotate.judges import JudgeError, concise, direct, load_judge, polite, positive, prefers_first, sigmoid, specific


def test_the_built_in_judges_rank_as_named():
    assert concise("q", "Paris.") > concise("q", "The capital of France is the city of Paris, on the Seine.")
    assert concise("q", "") < concise("q", "one two three")  # saying nothing is not concise, it is empty
    assert positive("q", "What a wonderful, lovely day: I love it!") > positive("q", "The weather is cold.") > positive("q", "A terrible, awful day.")
    assert positive("q", "") == 0.0


def test_a_density_judge_counts_one_percent_of_the_words_as_one_unit_of_noise():
    # Against T = 1, a unit must be a difference annotators notice in the default model's ~100-word
    # answers: one sentiment word, or one number, more than the other answer.
    filler = " ".join(["word"] * 99)
    assert positive("q", "good " + filler) - positive("q", filler) == pytest.approx(1.0)
    assert specific("q", filler + " 42") - specific("q", filler + " word") == pytest.approx(1.0)
    assert positive("q", "good") == pytest.approx(5.0)  # over at least 20 words: one word alone is not 100%
    assert polite("q", "thanks " + filler) - polite("q", filler) == pytest.approx(1.0)
    # direct: one number more is half a unit late in the answer, three in its opening 20 words, where it counts twice.
    assert direct("q", filler + " 42") - direct("q", filler + " word") == pytest.approx(0.5)
    assert direct("q", "42 " + filler) - direct("q", "word " + filler) == pytest.approx(3.0)


def test_judges_load_by_name_module_or_file(tmp_path):
    assert load_judge("concise") is concise
    assert load_judge("annotate.judges:positive") is positive
    mine = tmp_path / "my_judge.py"
    mine.write_text("def longer(prompt, completion):\n    return float(len(completion))\n")
    judge = load_judge(f"{mine}:longer")
    assert judge("q", "abc") == 3.0

    broken = tmp_path / "broken.py"
    broken.write_text("def judge(:\n")
    for spec, message in [
        ("nonsense", "expected one of concise, positive, specific, direct, polite"),
        (f"{tmp_path}/absent.py:judge", "is not a file"),
        (f"{mine}:absent", "has no function absent"),
        ("no_such_module_here:judge", "cannot import no_such_module_here"),
        (f"{broken}:judge", "failed to load: SyntaxError"),
    ]:
        with pytest.raises(JudgeError, match=message):
            load_judge(spec)


def test_a_noisy_annotator_prefers_the_better_one_at_the_sigmoid_rate():
    rng = random.Random(0)
    long, short = "one two three four five six seven eight nine ten", "one"
    margin = concise("q", short) - concise("q", long)  # 0.9
    for noise in (0.5, 2.0):
        share = sum(prefers_first(margin, noise, rng) for _ in range(8000)) / 8000
        assert share == pytest.approx(sigmoid(margin / noise), abs=0.02)
    assert all(prefers_first(margin, 0, rng) for _ in range(100))  # noise 0: always the better
    assert not prefers_first(-margin, 0, rng)
    assert sigmoid(-1000) == 0.0 and sigmoid(1000) == 1.0  # no overflow at the extremes


def test_the_specific_judge_rewards_concrete_content_not_length():
    concrete = "Water boils at 100 degrees Celsius at sea level; in Denver, at 1,609 m, it boils near 95."
    vague = "Water generally boils at some temperature, and it depends on various things, so it can vary a lot."
    assert specific("q", concrete) > 1 > 0 > specific("q", vague)
    padded = concrete + " " + " ".join(["and the water is hot"] * 10)
    assert specific("q", padded) < specific("q", concrete)  # more words with nothing concrete in them dilute it
    assert specific("q", "7.") == specific("q", "7") < specific("q", concrete)  # a bare number is not an answer
    assert specific("q", "The cat sat. The dog ran.") == 0.0  # a capital that starts a sentence is not a name
    assert specific("q", "") == 0.0


QUESTION = "At what temperature does water boil?"
DIRECT = "Water boils at 100 degrees Celsius (212 F) at sea level. Higher up the boiling point is lower: in Denver, at 1,609 m, water boils near 95 degrees."
EVASIVE = "That is a great question! There are many things to consider, and it might depend on various factors, so I am not sure. Perhaps look it up somewhere."
COURTEOUS = "Thank you for asking! You can keep your plants healthy by watering them once a week. I hope this helps, and please ask if you have more questions."
RUDE = "Obviously, plants need water. This is a silly question. Water them whatever way, it is not hard, and stop asking about it all the time."


@pytest.mark.parametrize("judge, better, worse", [(direct, DIRECT, EVASIVE), (polite, COURTEOUS, RUDE)])
def test_the_length_neutral_judges_rank_the_better_answer_first_whatever_its_length(judge, better, worse):
    assert judge(QUESTION, better) > judge(QUESTION, worse) + 5  # five units of noise apart: an annotator at T = 1 rarely errs
    for answer in (better, worse):
        assert judge(QUESTION, answer + " " + answer) == pytest.approx(judge(QUESTION, answer))  # said twice, it says no more
    padded = better + " " + " ".join(["and the rest is the same"] * 10)
    assert judge(QUESTION, padded) < judge(QUESTION, better)  # filler dilutes what an answer says
    fragment = " ".join(better.split()[:3])
    assert judge(QUESTION, fragment) < judge(QUESTION, better)  # a bare fragment is not an answer
    assert judge(QUESTION, "") == 0.0


def test_the_direct_judge_rewards_getting_to_the_point_early():
    preamble = "There are a lot of things that one could say on this, and the answer is a long story that goes back a long way. "
    assert direct(QUESTION, DIRECT) > direct(QUESTION, preamble + DIRECT) > direct(QUESTION, preamble + EVASIVE)
    # The question's own words count, matched on their stem: "boiling" answers "boil".
    assert direct(QUESTION, "The boiling point of water.") > direct(QUESTION, "The melting point of iron.")
