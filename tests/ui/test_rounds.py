"""Rounds and simulated annotators on the tiny model: the whole loop, through the real CLI and worker."""

import json
import math
import re
from contextlib import closing

import pytest

from store import open_database
from store.prompt_files import read_prompt_file
from store.prompts import Prompt
from store.reward_models import RewardModel
from tests.conftest import DEMO_PROMPTS, held_back_ids, read_parquet, run_tether, set_settings, short_training, vote_every_pair, vote_on_demo_pairs
from ui.owner.config import TetherConfig
from ui.owner.history import repeated_trigram_share
from ui.owner.round import choose_optimizer
from ui.owner.round_jobs import is_held_back


def test_the_held_back_prompts_are_a_stable_share_chosen_by_content():
    prompts = read_prompt_file(DEMO_PROMPTS)
    chosen = [p for p in prompts if is_held_back(Prompt(0, p.messages, p.content_hash, 0), 0.25)]
    assert 2 <= len(chosen) <= 12  # about a quarter of 28
    assert chosen == [p for p in read_prompt_file(DEMO_PROMPTS) if is_held_back(Prompt(9, [], p.content_hash, 5), 0.25)]
    assert not [p for p in prompts if is_held_back(Prompt(0, [], p.content_hash, 0), 0.0)]


def test_repeated_trigram_share_counts_loops_within_a_response():
    assert repeated_trigram_share([(5, "the cat sat on the mat")]) == 0.0
    looping = repeated_trigram_share([(9, "I am here I am here I am here")])  # 7 trigrams, 3 distinct
    assert looping == pytest.approx(4 / 7)
    assert repeated_trigram_share([(3, "a b c"), (3, "a b c")]) == 0.0  # the same phrase in two responses is no loop


def test_a_round_trains_a_reward_model_runs_ppo_and_queues_new_against_old_pairs(tiny_project, tiny_model_dir):
    short_training(tiny_project)
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    nothing = run_tether("round", "--project", str(tiny_project))
    assert nothing.returncode == 1 and "no resolved comparisons" in nothing.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:  # refused before it began: no round recorded
        assert con.execute("SELECT count(*) FROM rounds").fetchone() == (0,)
    run_tether("generate", "--project", str(tiny_project), check=True)
    vote_every_pair(tiny_project)

    done = run_tether("round", "--optimizer", "ppo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    # [round] candidates = 1 and register = "best" (tiny_project): its one is registered.
    assert done.stdout.startswith("round 1: policy v1 from v0; candidate 1 of 1 (job 3) registered as v1: predicted win rate over v0 ")
    assert "; reward model v1 held-out accuracy " in done.stdout and "PPO 1 steps, at its last step KL to v0 " in done.stdout
    held_back = held_back_ids(tiny_project)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rounds = con.execute("SELECT id, status, policy_from, reward_version, policy_to, error FROM rounds ORDER BY id").fetchall()
        jobs = con.execute("SELECT kind, status, config->>'policy_version', config->>'against' FROM jobs WHERE round = 1 ORDER BY id").fetchall()
        ppo_dir = con.execute("SELECT id FROM jobs WHERE round = 1 AND kind = 'ppo'").fetchone()[0]
        policy = con.execute("SELECT version, parent, round FROM policies WHERE version = 1").fetchone()
        cross = con.execute(
            """
            SELECT p.prompt_id, ca.prompt_id, cb.prompt_id, ca.policy_version, cb.policy_version
            FROM pairs p JOIN completions ca ON ca.id = p.completion_a JOIN completions cb ON cb.id = p.completion_b
            WHERE p.strategy = 'cross_version'
            """
        ).fetchall()
        same_policy = {prompt for (prompt,) in con.execute("SELECT prompt_id FROM pairs WHERE strategy = 'same_policy'").fetchall()}
    assert rounds == [(1, "done", 0, 1, 1, None)]
    # `tether generate` answered the prompts policies train on; the round answers the held-back ones with v0, then v1.
    assert jobs == [("reward_model", "done", None, None), ("ppo", "done", "0", None), ("predict", "done", None, None),
                    ("generate", "done", "0", None), ("generate", "done", "1", "0")]
    assert same_policy and not same_policy & held_back, "a vote on two of v0's answers to a held-back prompt trains nothing"
    assert policy == (1, 0, 1)
    trained_on = {r["prompt_id"] for r in read_parquet(tiny_project / "jobs" / str(ppo_dir) / "inputs" / "prompts.parquet")}
    assert trained_on and not trained_on & held_back, "PPO must not train on the held-back prompts"
    assert cross and {c[0] for c in cross} <= held_back
    for prompt, a_prompt, b_prompt, a_version, b_version in cross:
        assert prompt == a_prompt == b_prompt and (a_version, b_version) == (1, 0)

    history = run_tether("rounds", "--project", str(tiny_project), check=True).stdout
    assert "v0 → v1" in history and "PPO: steps 1, batch_size 4" in history
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        adapter = con.execute("SELECT adapter_path FROM policies WHERE version = 1").fetchone()[0]
        metrics = {name for (name,) in con.execute("SELECT DISTINCT name FROM metrics WHERE job_id = ?", [ppo_dir]).fetchall()}
    assert {"score", "kl", "kl_to_start", "finished", "entropy", "response_length"} <= metrics
    from peft import PeftModel

    from train.common.config import ModelConfig
    from train.common.models import load_model

    base, _ = load_model(ModelConfig(name_or_path=str(tiny_model_dir), device="cpu"))
    model = PeftModel.from_pretrained(base, str(tiny_project / adapter))  # plain PEFT, no Tether code
    assert any("lora_B" in name and param.abs().sum() > 0 for name, param in model.named_parameters())


def test_ppo_trains_every_step_and_the_predictor_alone_holds_the_kl_budget(tiny_project):
    """The budget is measured once, by the predictor on held-back prompts: a PPO step's few training responses at PPO's
    temperature read far more (20 nats where the predictor read 12, scripts/BENCHMARKS.md) and must not end the run."""
    short_training(tiny_project)
    set_settings(tiny_project, "ppo", steps=3, learning_rate=3e-3)
    set_settings(tiny_project, "round", kl_budget=0.001)
    vote_on_demo_pairs(tiny_project)

    done = run_tether("round", "--optimizer", "ppo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        ppo = con.execute("SELECT id FROM jobs WHERE kind = 'ppo'").fetchone()[0]
        updated = con.execute("SELECT step FROM metrics WHERE job_id = ? AND name = 'kl' ORDER BY step", [ppo]).fetchall()
        losses = con.execute("SELECT count(*) FROM metrics WHERE job_id = ? AND name = 'policy_loss'", [ppo]).fetchone()[0]
        kl_to_v0, chosen, verdict = con.execute("SELECT kl_to_v0, chosen, verdict FROM candidates").fetchone()
        versions = con.execute("SELECT count(*) FROM policies").fetchone()[0]
        policy_to = con.execute("SELECT policy_to FROM rounds").fetchone()[0]
    assert [step for (step,) in updated] == [1, 2, 3] and losses == 3  # every step updated, whatever its responses' KL
    # PPO's whole step is mostly past 0.001 nats: the predictor pulls it back along its step from v0 and measures the
    # cut again, on fresh answers. The tiny model's few short answers put each KL on either side of the budget, from one
    # seed or machine to another (the whole step too, once in a quick-tier run); whichever the predictor read, the
    # budget holds: a step or a cut within it is registered, one past it is not.
    cut = re.search(r", at ([0-9.e-]+) of its step from v0 \(the whole step: \d+\.\d nats\)", verdict)
    if chosen:
        assert kl_to_v0 <= 0.001 and verdict.startswith("registered, rated best: ") and (versions, policy_to) == (2, 1)
        assert "registered as v1" in done.stdout
        assert cut is None or float(cut[1]) < 1 and "within the round's KL allowance" in done.stdout, (verdict, done.stdout)
    else:
        assert cut and float(cut[1]) < 1, verdict
        assert kl_to_v0 > 0.001 and verdict.startswith(f"over the KL budget: {kl_to_v0:.1f} nats from v0, at ")
        assert (versions, policy_to) == (1, None)
        assert "nothing registered: over the round's KL allowance ([round] kl_budget, kl_per_vote), so the round's votes carry over to the next" in done.stdout


@pytest.mark.parametrize("limit", ["kl_budget", "kl_per_vote"])
def test_a_candidate_past_the_kl_budget_is_pulled_back_along_its_step_and_registered_within_it(tiny_project, limit):
    """Issue 59: a round whose candidate went past [round] kl_budget registered nothing (the judge had rated two such
    candidates 67% and 81% over their start). Now the predictor scales the candidate's LoRA update down to inside the
    budget, measures that policy's KL again on fresh answers, and rates and registers it if it is inside. The same
    where the round's allowance is [round] kl_per_vote times the votes held, under a kl_budget far above it."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from store.db import utcnow
    from store.policies import get_policy
    from store.users import add_user
    from tests.conftest import vote_through_queue
    from train.worker import KL_BUDGET_TARGET
    from ui.owner.project import load_project

    set_settings(tiny_project, "dpo", batch_size=4, epochs=3, pairs="human", learning_rate=1e-2, precision="fp32")
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    run_tether("generate", "--project", str(tiny_project), check=True)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:  # the shorter answer wins: votes alike on every run
        add_user(con, "tester", "annotator", "not a password hash: it never signs in", "a test", utcnow())
        vote_through_queue(con, "tester", lambda a: ("left" if (len(a.left_text), a.left_text) < (len(a.right_text), a.right_text)
                                                     else "right", None, None))
    unbounded = tiny_project.parent / "unbounded"
    shutil.copytree(tiny_project, unbounded)  # the same round with no budget: how far its candidate goes
    set_settings(unbounded, "round", kl_budget=0.0)
    assert run_tether("round", "--optimizer", "dpo", "--project", str(unbounded)).returncode == 0
    with closing(open_database(unbounded / "tether.duckdb")) as con:
        (whole,) = con.execute("SELECT kl_to_v0 FROM candidates").fetchone()
    assert whole > 0.1, "the longer answers' votes must move the policy for the cut to be seen"
    budget = whole / 2
    if limit == "kl_budget":
        set_settings(tiny_project, "round", kl_budget=budget)
    else:
        with closing(open_database(tiny_project / "tether.duckdb")) as con:
            (votes,) = con.execute("SELECT count(*) FROM comparisons").fetchone()
        set_settings(tiny_project, "round", kl_budget=whole * 10, kl_per_vote=budget / votes)

    done = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        (dpo,) = con.execute("SELECT id FROM jobs WHERE kind = 'dpo'").fetchone()
        kl_to_v0, chosen, verdict = con.execute("SELECT kl_to_v0, chosen, verdict FROM candidates").fetchone()
        versions = con.execute("SELECT count(*) FROM policies").fetchone()[0]
        policy_to = con.execute("SELECT policy_to FROM rounds").fetchone()[0]
    # Cut to where a KL growing with the square of the share kept reads 0.9 of the budget: the same candidate as the
    # unbounded round's, so its step's KL is `whole`, past the budget, and the pull-back is needed. A cut measured
    # still past it is cut once more, shorter, but no shorter than in proportion to the KL.
    (predict_job,) = tiny_project.glob("jobs/*/within-budget-1")
    (prediction,) = json.loads((predict_job.parent / "result.json").read_text())["predictions"]
    scale, first_cut = prediction["scale"], math.sqrt(KL_BUDGET_TARGET * budget / whole)
    assert prediction["whole_kl"] == pytest.approx(whole) and (
        scale == first_cut or KL_BUDGET_TARGET * budget / whole <= scale < first_cut)
    assert f"at {scale:.2g} of its step from v0 (the whole step: {whole:.1f} nats)" in verdict and kl_to_v0 != whole
    trained = load_file(tiny_project / "jobs" / str(dpo) / "policy" / "adapter_model.safetensors")
    assert any("lora_B" in key for key in trained)

    def the_step_cut(adapter) -> bool:  # the same step from v0, shorter: every B scaled alike, A as it was
        return adapter.keys() == trained.keys() and all(
            torch.equal(adapter[key], weights * scale if "lora_B" in key else weights) for key, weights in trained.items())

    # The cut's KL is then measured again, on fresh answers. It need not fall in proportion, nor at all: on the tiny
    # model, over 8 DPO seeds, it read 0.37 to 1.29 of the whole step's (0.37 to 1.00 at 32 answers a prompt), so on
    # either side of the budget. Whichever the predictor decided, the budget holds: the cut it registered it measured
    # within the budget, and one it measured past it stays in the predictor's job, nothing registered.
    if chosen:
        assert kl_to_v0 <= budget and (versions, policy_to) == (2, 1)
        assert verdict.startswith("registered, rated best: ") and f"at {scale:.2g} of its step from v0, within the round's KL allowance" in done.stdout
        registered = load_file(tiny_project / load_project(tiny_project).run(get_policy, None).adapter_path / "adapter_model.safetensors")
        assert the_step_cut(registered)
    else:
        assert kl_to_v0 > budget and (versions, policy_to) == (1, None) and verdict.startswith("over the KL budget")
        assert "nothing registered: over the round's KL allowance ([round] kl_budget, kl_per_vote), so the round's votes carry over to the next" in done.stdout
        assert the_step_cut(load_file(predict_job / "adapter_model.safetensors"))


def test_auto_runs_dpo_until_the_reward_model_steers_then_its_trusted_optimizer_and_says_why(tiny_project):
    """[round] optimizer = "auto", the default. A round with nothing new for its reward model reuses the newest."""
    short_training(tiny_project)
    set_settings(tiny_project, "dpo", batch_size=4)
    vote_on_demo_pairs(tiny_project)

    first = run_tether("round", "--project", str(tiny_project))
    assert first.returncode == 0, first.stderr
    untrusted = "auto: DPO on the votes, as reward model v1 does not steer the loop yet: no earlier version has been measured on votes it never saw"
    assert first.stdout.startswith(f"round 1: policy v1 from v0; {untrusted}; candidate 1 of 1 (job 3) registered as v1")
    # The new-against-old pairs have no votes yet: the next round has nothing new to train a reward model on.
    set_settings(tiny_project, "reward_model", trust="always")
    set_settings(tiny_project, "round", candidates=2, trusted_optimizer="ppo")  # PPO, and DPO beside it
    set_settings(tiny_project, "ppo", uncertainty_penalty=0.5)  # a conservative reward, off by default
    second = run_tether("round", "--project", str(tiny_project))
    assert second.returncode == 0, second.stderr
    trusted = ('auto: PPO against reward model v1, which steers the loop: [reward_model] trust = "always"; '
               "its reward is the heads' mean less 0.5 times their spread")
    assert second.stdout.startswith(f"round 2: policy v2 from v1; reward model v1 reused: the votes hold nothing it did not train on; {trusted}; ")
    assert "; candidate 1 of 1 (job 7) registered as v2: predicted win rate over v1 " in second.stdout
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rounds = con.execute("SELECT optimizer, reward_version, policy_to FROM rounds ORDER BY id").fetchall()
        jobs = con.execute("SELECT round, kind FROM jobs WHERE round IS NOT NULL ORDER BY id").fetchall()
        penalty = con.execute("SELECT config->'ppo'->>'uncertainty_penalty' FROM jobs WHERE kind = 'ppo'").fetchone()[0]
    assert rounds == [("dpo", 1, 1), ("ppo", 1, 2)]  # the round's optimiser is PPO's, whichever candidate it registered
    # DPO beside PPO would have had no vote that v1 has not learnt: the round went on with its one candidate, and says so.
    # Round 1 answers the held-back prompts with v0 first (`tether generate` answers the others), round 2 has v1's.
    assert jobs == [(1, "reward_model"), (1, "dpo"), (1, "predict"), (1, "generate"), (1, "generate"), (2, "ppo"), (2, "predict"),
                    (2, "generate")]
    assert "1 of [round] candidates = 2 trained: no resolved votes that policy v1 has not trained on" in second.stdout
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT round, optimizer FROM candidates ORDER BY job").fetchall() == [(1, "dpo"), (2, "ppo")]
    assert float(penalty) == 0.5
    history = run_tether("rounds", "--project", str(tiny_project), check=True).stdout.splitlines()
    header = history[0].split()
    assert header[:4] == ["round", "status", "policy", "ran"]
    assert history[1].split()[5:7] == ["DPO", "(auto)"] and history[2].split()[5:7] == ["PPO", "(auto)"]
    assert any(line.startswith(f"round 1: {untrusted}; candidate 1 of 1") for line in history)
    assert any(line.startswith(f"round 2: reward model v1 reused: the votes hold nothing it did not train on; {trusted}; 1 of [round] candidates = 2 trained") for line in history)


def test_auto_keeps_to_dpo_on_the_votes_once_the_reward_model_steers_unless_told_otherwise():
    """[round] trusted_optimizer = "dpo", the default: at 96 votes a round PPO against a steering reward model gained less
    than DPO on the votes (scripts/BENCHMARKS.md). The round says the reward model steers, and why DPO runs all the same."""
    measured = RewardModel(3, "", "", {"new_votes_accuracy": 0.7, "new_votes_pairs": 80, "new_votes_from": 2})
    unmeasured = RewardModel(1, "", "", {})
    config = TetherConfig()
    assert choose_optimizer(measured, config) == ("dpo", 'auto: DPO on the votes, as [round] trusted_optimizer = "dpo", though reward model v3 '
                                                         "steers the loop: v2 agreed with 70% of 80 votes it never saw (95% lower bound 59%)")
    assert choose_optimizer(unmeasured, config)[0] == "dpo"
    config.round.trusted_optimizer = "grpo"
    assert choose_optimizer(measured, config)[0] == "grpo" and choose_optimizer(unmeasured, config)[0] == "dpo"


def test_a_round_trains_its_candidates_and_registers_the_one_the_predictor_rates_best(tiny_project):
    short_training(tiny_project)
    set_settings(tiny_project, "dpo", batch_size=4, pairs="human")
    set_settings(tiny_project, "round", candidates=2, predictor_answers=3)  # register = "best" (tiny_project): one is registered
    vote_on_demo_pairs(tiny_project)

    done = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    held_back = held_back_ids(tiny_project)
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        candidates = con.execute("SELECT job, seed, win_rate, low, high, kl_to_v0, answers, chosen, verdict FROM candidates ORDER BY job").fetchall()
        predictor = con.execute("SELECT id, config FROM jobs WHERE kind = 'predict'").fetchone()
        version = con.execute("SELECT version, parent, round, job, adapter_path FROM policies WHERE version = 1").fetchone()
        kinds = con.execute("SELECT kind FROM jobs WHERE round = 1 ORDER BY id").fetchall()
    assert [k for (k,) in kinds] == ["reward_model", "dpo", "dpo", "predict", "generate", "generate"]
    (first, first_seed, *_), (second, second_seed, *_) = candidates
    assert second_seed - first_seed == 1000  # each its own seed
    best = max(candidates, key=lambda c: c[2])
    assert [c[7] for c in candidates] == [c is best for c in candidates]
    assert best[8].startswith("registered, rated best: ") and [c for c in candidates if c is not best][0][8].startswith("rated below another: ")
    for _, _, rate, low, high, kl, answers, *_ in candidates:
        assert 0 <= low <= rate <= high <= 1 and kl == kl  # a number, not NaN
    config = json.loads(predictor[1])
    asked = read_parquet(tiny_project / "jobs" / str(predictor[0]) / "inputs" / "prompts.parquet")
    assert asked and {r["prompt_id"] for r in asked} <= held_back  # prompts no candidate trained on
    assert candidates[0][6] == 3 * len(asked) and config["generation"]["seed"] == 1  # every policy sampled with the round's seed
    assert [c["job"] for c in config["candidates"]] == [first, second]
    seen = read_parquet(tiny_project / "jobs" / str(predictor[0]) / "answers.parquet")  # what the predictor read, kept
    assert [sum(r["job"] == job for r in seen) for job in (None, first, second)] == [3 * len(asked)] * 3
    # The registered candidate's adapter is v1's; the other stays in its job.
    assert version == (1, 0, 1, best[0], "policies/v1")
    assert not (tiny_project / "jobs" / str(best[0]) / "policy").exists()
    other = second if best[0] == first else first
    assert (tiny_project / "jobs" / str(other) / "policy" / "adapter_model.safetensors").exists()
    history = run_tether("rounds", "--project", str(tiny_project), check=True).stdout
    assert re.search(r"DPO \d+% \[\d+%, \d+%\]( registered)?, DPO \d+% \[\d+%, \d+%\]( registered)?", history) and "registered" in history


@pytest.mark.parametrize("optimizer", ["dpo", "grpo"])
def test_a_round_that_registers_the_average_of_its_candidates_serves_their_averaged_adapter(tiny_project, tmp_path, optimizer):
    import torch
    from safetensors.torch import load_file

    from store.policies import dpo_jobs_behind
    from train.policy.adapters import average_adapters

    short_training(tiny_project)
    set_settings(tiny_project, "dpo", batch_size=4, pairs="human")
    set_settings(tiny_project, "grpo", steps=2, prompts_per_step=2, group_size=2, minibatches=1, epochs=1)
    set_settings(tiny_project, "round", candidates=2, predictor_answers=2, register="average")
    vote_on_demo_pairs(tiny_project)

    done = run_tether("round", "--optimizer", optimizer, "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("round 1: policy v1 from v0; the average of its 2 candidates registered as v1: predicted win rate over v0 ")
    assert re.search(rf"; its first candidate's (robust )?{optimizer.upper()} ", done.stdout), done.stdout
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        candidates = con.execute("SELECT job, optimizer, seed, chosen, verdict, win_rate FROM candidates ORDER BY job").fetchall()
        predictor = con.execute("SELECT id FROM jobs WHERE kind = 'predict'").fetchone()[0]
        version = con.execute("SELECT job, adapter_path FROM policies WHERE version = 1").fetchone()
        lineage = dpo_jobs_behind(con, 1)
    (first, *_), (second, *_), average = candidates
    assert [c[1:4] for c in candidates] == [(optimizer, candidates[0][2], False), (optimizer, candidates[0][2] + 1000, False), ("average", None, True)]
    assert average[0] == predictor and average[4].startswith("registered, the average: ") and average[5] is not None
    # The parts are not sampled: the predictor rates the one policy the round registers.
    assert [c[4:] for c in candidates[:2]] == [(f"averaged into job {predictor}'s average", None)] * 2
    assert version == (None, "policies/v1")
    assert lineage == ([first, second] if optimizer == "dpo" else [])  # v1 learnt both DPO candidates' pairs
    # The candidates started from one initialisation, and their own seeds gave them their own batches and samples: their
    # down-projections are still nearly the same (with initialisations of their own, cosine about 0), the rest not.
    parts = [load_file(tiny_project / "jobs" / str(job) / "policy/adapter_model.safetensors") for job in (first, second)]
    downs = [torch.nn.functional.cosine_similarity(parts[0][k].flatten(), parts[1][k].flatten(), dim=0) for k in parts[0] if "lora_A" in k]
    assert len(downs) > 0 and min(downs) > 0.9
    assert any(not torch.equal(parts[0][k], parts[1][k]) for k in parts[0] if "lora_B" in k)
    average_adapters([tiny_project / "jobs" / str(job) / "policy" for job in (first, second)], tmp_path / "check")
    served, expected = load_file(tiny_project / "policies/v1/adapter_model.safetensors"), load_file(tmp_path / "check/adapter_model.safetensors")
    assert served.keys() == expected.keys() and all(torch.equal(served[k], expected[k]) for k in served)
    history = run_tether("rounds", "--project", str(tiny_project), check=True).stdout
    assert re.search(r"AVERAGE \d+% \[\d+%, \d+%\] registered", history), history
    assert not re.search(rf"{optimizer.upper()} \d+% \[", history), history


# One answer a held-back prompt, and a 98% interval: the predictor cannot be sure of a candidate unless it beats the
# start on every prompt under every head of the reward model.
UNSURE = {"register": "confident", "predictor_answers": 1, "predictor_confidence": 0.98}


def test_a_round_that_registers_no_candidate_says_why_and_its_votes_carry_over(tiny_project):
    """No candidate is registered when none is predicted better than the start with confidence: the round ends done,
    with no new version, and the next round's DPO learns the same votes again, as no version has learnt them."""
    short_training(tiny_project)
    set_settings(tiny_project, "dpo", batch_size=4, pairs="human")
    set_settings(tiny_project, "round", **UNSURE)
    vote_on_demo_pairs(tiny_project)

    done = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("round 1 from v0: no candidate registered: none of 1 was predicted better than v0 with confidence ")
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT status, policy_to FROM rounds").fetchall() == [("done", None)]
        assert con.execute("SELECT max(version) FROM policies").fetchone()[0] == 0
        [(chosen, verdict)] = con.execute("SELECT chosen, verdict FROM candidates").fetchall()
        assert not chosen and verdict.startswith("not predicted better than the start with confidence: ")
        assert [k for (k,) in con.execute("SELECT kind FROM jobs WHERE round = 1 ORDER BY id").fetchall()] == ["reward_model", "dpo", "predict"]
    history = run_tether("rounds", "--project", str(tiny_project), check=True).stdout
    assert "none registered" in history and "v0 →" in history

    set_settings(tiny_project, "round", register="best")
    assert run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project)).returncode == 0
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        trained = [json.loads(c)["policy_version"] for (c,) in con.execute("SELECT config FROM jobs WHERE kind = 'dpo' ORDER BY id").fetchall()]
        jobs = [j for (j,) in con.execute("SELECT id FROM jobs WHERE kind = 'dpo' ORDER BY id").fetchall()]
    pairs = [{r["pair_id"] for r in read_parquet(tiny_project / "jobs" / str(j) / "inputs" / "preferences.parquet")} for j in jobs]
    assert trained == [0, 0] and pairs[0] and pairs[0] <= pairs[1]


def test_a_round_with_fewer_pairs_than_min_pairs_is_refused_and_the_next_learns_its_votes(tiny_project):
    """DPO on a few noisy pairs is a handful of optimiser steps that gains little and can lose (scripts/BENCHMARKS.md):
    a round with fewer than [round] min_pairs is refused before anything is recorded or trained, and says so; the
    first with enough trains on every carried vote."""
    short_training(tiny_project)
    set_settings(tiny_project, "dpo", batch_size=4, pairs="human")
    set_settings(tiny_project, "round", min_pairs=1000)
    vote_on_demo_pairs(tiny_project)

    for optimizer in ("dpo", "auto"):  # 'auto' with no reward model yet would choose DPO on the votes
        refused = run_tether("round", "--optimizer", optimizer, "--project", str(tiny_project))
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        found = re.search(r"Error: DPO on the votes would train policy v0 on (\d+) pairs it has not learnt outside "
                          r"the held-back prompts, fewer than \[round\] min_pairs = 1000", refused.stderr)
        assert found, refused.stderr
    pairs = int(found.group(1))
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM rounds").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM jobs WHERE kind <> 'generate'").fetchone() == (0,)  # vote_on_demo_pairs generates

    set_settings(tiny_project, "round", min_pairs=pairs)
    done = run_tether("round", "--optimizer", "dpo", "--project", str(tiny_project))
    assert done.returncode == 0 and done.stdout.startswith("round 1: policy v1 from v0"), done.stdout + done.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        [job] = [j for (j,) in con.execute("SELECT id FROM jobs WHERE kind = 'dpo'").fetchall()]
    assert len(read_parquet(tiny_project / "jobs" / str(job) / "inputs" / "preferences.parquet")) == pairs


def test_a_round_after_rm_train_reuses_its_version_when_the_votes_hold_nothing_new(tiny_project):
    """Issue 46: with a LoRA reward model, a round right after `tether rm train` refused: "no new resolved comparisons"."""
    short_training(tiny_project)
    set_settings(tiny_project, "reward_model", kind="lora", epochs=1)
    vote_on_demo_pairs(tiny_project)
    run_tether("rm", "train", "--project", str(tiny_project), check=True)

    done = run_tether("round", "--optimizer", "ppo", "--project", str(tiny_project))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("round 1: policy v1 from v0; reward model v1 reused: the votes hold nothing it did not train on; ")
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM reward_models").fetchone()[0] == 1
        assert con.execute("SELECT reward_version, policy_to FROM rounds").fetchall() == [(1, 1)]
    # Other settings make another model: no reuse, and the LoRA model refuses again to train on what it saw.
    set_settings(tiny_project, "reward_model", lora_dropout=0.1)
    assert run_tether("round", "--optimizer", "ppo", "--project", str(tiny_project)).returncode == 0
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM reward_models").fetchone()[0] == 2


def test_simulate_votes_through_the_queue_and_reports_each_round(tiny_project, tmp_path):
    short_training(tiny_project)
    # Half the pairs want two votes. The queue serves each annotator the first pair in its order that
    # still wants a vote, so the second annotator meets every overlapped pair the first voted on; with
    # every pair overlapped, a round's 10 votes fell on 5 pairs, too few resolved ones to train on.
    set_settings(tiny_project, "queue", overlap_share=0.5)
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"Say something about the number {i}."}) + "\n" for i in range(5)))

    result = run_tether(
        "simulate", "--judge", "concise", "--noise", "0.2", "--annotators", "2", "--labels-per-round", "10",
        "--rounds", "2", "--eval-prompts", str(eval_file), "--eval-samples", "2", "--report", str(tmp_path / "rounds.jsonl"),
        "--optimizer", "ppo", "--project", str(tiny_project),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    report = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [(r["round"], r["optimizer"], r["policy"], r["votes"], r["pairs"]) for r in report] == [(1, "ppo", 1, 10, 10), (2, "ppo", 2, 10, 10)]
    assert lines[1].startswith("round 0: policy v0, judge mean score")
    assert re.fullmatch(r"noise T = 0\.2, as given: votes on v0's 5 pairs of answers to the same evaluation prompt "
                        r"would side with the judge \d+\.\d% of the time", lines[2])
    for number in (1, 2):
        line = next(line for line in lines if line.startswith(f"round {number}:"))
        assert f"policy v{number}: judge win rate over v0" in line and "on 10 answers" in line
        figures = report[number - 1]
        assert f"KL to v0 {figures['kl_to_v0']:.2f}," in line and f"{figures['win_rate']:.1%} [{figures['low']:.1%}" in line
        assert figures["seconds"] >= sum(figures["stages"].values()) and set(figures["stages"]) >= {"votes", "PPO", "evaluation"}
        agreement = re.search(r"10 votes, (\d+\.\d)% of them sided with the noiseless judge \(\d+\.\d% expected\)", line)
        assert agreement and float(agreement[1]) == pytest.approx(100 * figures["agreement"], abs=0.05)
        assert figures["noise"] == 0.2 and 0.5 <= figures["expected_agreement"] <= 1
        assert re.search(rf"over v{number - 1} \d+\.\d%", line) and "of its answers ended" in line
        follows = figures["reward_model_follows_judge"]  # of round's reward model, on the new policy's answers
        assert figures["strategy"] == "active" and -1 <= follows <= 1
        assert f"the reward model's score correlates {follows:.2f} with the judge's within a prompt" in line
        took = next(line for line in lines if line.startswith(f"round {number} took"))
        assert all(stage in took for stage in ("votes", "reward model", "PPO", "completions", "evaluation"))
    assert "v1 agreed with" in next(line for line in lines if line.startswith("round 2:"))  # the warm start measured v1 on the new votes
    with closing(open_database(tiny_project / "tether.duckdb")) as con:  # each version's KL as its round measured it, not again
        registered = con.execute("SELECT kl_to_v0 FROM candidates WHERE chosen ORDER BY round").fetchall()
    assert [(r["kl_to_v0"],) for r in report] == registered
    table = lines.index("the rounds as people (the simulated annotators) saw them:")
    assert lines[table + 1].split()[:3] == ["round", "status", "policy"] and len(lines) >= table + 4
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        ended = con.execute("SELECT policy_version, count(*) FILTER (WHERE finished), count(*) FROM completions GROUP BY ALL ORDER BY 1").fetchall()
    assert len(ended) == 3 and ("answers that ended, not cut at the length limit: "
                                + ", ".join(f"v{v} {done / total:.0%} of {total}" for v, done, total in ended)) in lines
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        votes = con.execute("SELECT annotator, source, count(*) FROM comparisons GROUP BY ALL ORDER BY annotator").fetchall()
        open_leases = con.execute("SELECT count(*) FROM assignments WHERE closed_at IS NULL").fetchone()[0]
        overlapped = con.execute("SELECT count(*) FROM (SELECT pair_id FROM comparisons GROUP BY pair_id HAVING count(*) = 2)").fetchone()[0]
        most_votes = con.execute("SELECT max(n) FROM (SELECT count(*) n FROM comparisons GROUP BY pair_id)").fetchone()[0]
        rounds = con.execute("SELECT status, policy_from, policy_to FROM rounds ORDER BY id").fetchall()
        ppo_seeds = con.execute("SELECT config->'ppo'->>'seed' FROM jobs WHERE kind = 'ppo' ORDER BY id").fetchall()
    # 10 a round, and up to 10 more at the end on the last round's new-against-old pairs.
    assert 20 < sum(n for _, _, n in votes) <= 30 and {(a, s) for a, s, _ in votes} == {("simulated-1", "simulate"), ("simulated-2", "simulate")}
    assert open_leases == 0
    assert overlapped > 0 and most_votes == 2  # both annotators on some pairs, and never more votes than wanted
    assert rounds == [("done", 0, 1), ("done", 1, 2)]
    assert ppo_seeds == [("0",), ("1",)]  # each round's PPO draws other prompts than the last


def test_simulate_cut_off_after_a_round_goes_on_over_v0_with_each_round_on_its_own_votes(tiny_project, tmp_path):
    """scripts/bench_curve.py's loop goes on after a cut: the second run's round is round 2, measured over v0 (not over
    v1, the version serving when it starts), and trains on as many new votes as an uncut run's, its schedule's second
    count, counting those the first run cast at its end."""
    short_training(tiny_project)
    set_settings(tiny_project, "queue", overlap_share=0.5)
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"Say something about the number {i}."}) + "\n" for i in range(5)))
    report = tmp_path / "rounds.jsonl"
    for extra in ([], ["--baseline", "0"]):
        result = run_tether("simulate", "--judge", "concise", "--noise", "0.2", "--annotators", "2", "--labels-per-round", "10,16",
                            "--rounds", "1", "--eval-prompts", str(eval_file), "--eval-samples", "2", "--report", str(report),
                            "--optimizer", "ppo", *extra, "--project", str(tiny_project))
        assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("sampling 2 answers from v0 ") and lines[1].startswith("round 0: policy v0,")
    line = next(line for line in lines if line.startswith("round 2:"))
    assert "policy v2: judge win rate over v0" in line and re.search(r"over v1 \d+\.\d%", line)
    figures = [json.loads(line) for line in report.read_text().splitlines()]
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        rounds = con.execute("SELECT status, policy_from, policy_to, comparisons_at_start FROM rounds ORDER BY id").fetchall()
        registered = con.execute("SELECT kl_to_v0 FROM candidates WHERE chosen ORDER BY round").fetchall()
    assert rounds == [("done", 0, 1, 10), ("done", 1, 2, 26)]
    assert [f["round"] for f in figures] == [1, 2] and [(f["kl_to_v0"],) for f in figures] == registered


def test_simulate_with_no_rounds_casts_its_votes_on_v0s_answers_and_trains_nothing(tiny_project, tmp_path):
    """As a team collects votes before it trains once (scripts/bench_curve.py's offline arms): more of v0's answers
    are paired until every vote is cast."""
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"Say something about the number {i}."}) + "\n" for i in range(3)))
    result = run_tether("simulate", "--judge", "concise", "--noise", "0.2", "--labels-per-round", "40", "--rounds", "0",
                        "--eval-prompts", str(eval_file), "--eval-samples", "2", "--project", str(tiny_project))
    assert result.returncode == 0, result.stderr
    assert re.search(r"^40 votes on v0's answers, \d+\.\d% of them sided with the noiseless judge$", result.stdout, re.M), result.stdout
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM comparisons").fetchone() == (40,)
        assert con.execute("SELECT DISTINCT policy_version FROM completions").fetchall() == [(0,)]
        assert con.execute("SELECT count(*) FROM rounds").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM jobs WHERE kind <> 'generate'").fetchone() == (0,)


def test_simulate_judges_the_candidate_a_round_kept_out_against_the_rounds_start(tiny_project, tmp_path):
    """Where a round registers none, the version it started from serves on, and the judge measures the candidate the
    predictor rated best against that start: what the round would have served without the predictor."""
    short_training(tiny_project)
    set_settings(tiny_project, "dpo", batch_size=4, pairs="human")
    set_settings(tiny_project, "round", candidates=2, **UNSURE)
    set_settings(tiny_project, "queue", overlap_share=0.0)
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"Say something about the number {i}."}) + "\n" for i in range(3)))
    result = run_tether("simulate", "--judge", "concise", "--noise", "0.2", "--labels-per-round", "12", "--rounds", "1",
                        "--eval-prompts", str(eval_file), "--eval-samples", "2", "--report", str(tmp_path / "rounds.jsonl"),
                        "--optimizer", "dpo", "--project", str(tiny_project))
    assert result.returncode == 0, result.stderr
    [report] = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert (report["start"], report["policy"], report["registered"]) == (0, 0, False)
    assert report["over_start"] == 0.5 and report["win_rate"] == 0.5  # v0 against itself
    top = max(report["candidates"], key=lambda c: c["predicted"])
    assert [c["top"] for c in report["candidates"]] == [c is top for c in report["candidates"]]
    assert 0 <= top["judge_over_start"] <= 1 and all(c["judge_over_start"] is None for c in report["candidates"] if c is not top)
    assert all(c["verdict"].startswith("not predicted better") and not c["chosen"] for c in report["candidates"])
    line = next(line for line in result.stdout.splitlines() if line.startswith("round 1:"))
    assert "no version registered: v0 serves on" in line
    shown = [line for line in result.stdout.splitlines() if line.startswith("  candidate job ")]
    assert len(shown) == 2 and all(re.match(r"  candidate job \d+ \(DPO, seed \d+\): predicted \d+\.\d% \[", line) for line in shown)


def test_simulate_reports_dpos_margin_and_accuracy_over_all_its_steps(tiny_project, tmp_path):
    short_training(tiny_project)
    set_settings(tiny_project, "dpo", batch_size=4, pairs="human")
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"Say something about the number {i}."}) + "\n" for i in range(3)))
    result = run_tether("simulate", "--judge", "concise", "--noise", "0.2", "--labels-per-round", "12", "--rounds", "1",
                        "--eval-prompts", str(eval_file), "--eval-samples", "2", "--optimizer", "dpo", "--project", str(tiny_project))
    assert result.returncode == 0, result.stderr
    with closing(open_database(tiny_project / "tether.duckdb")) as con:
        margin, accuracy, steps = con.execute(
            """SELECT avg(value) FILTER (WHERE name = 'margin'), avg(value) FILTER (WHERE name = 'accuracy'),
                      count(*) FILTER (WHERE name = 'accuracy')
               FROM metrics JOIN jobs ON jobs.id = job_id WHERE kind = 'dpo'"""
        ).fetchone()
    line = next(line for line in result.stdout.splitlines() if line.startswith("round 1:"))
    assert steps > 1 and f"margin {margin:+.3f} and accuracy {accuracy:.1%} on average over its {steps} steps" in line, line


def test_simulate_names_a_judge_it_cannot_load(tiny_project, tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"prompt": "Hi"}) + "\n")
    result = run_tether("simulate", "--judge", "nosuch", "--eval-prompts", str(eval_file), "--project", str(tiny_project))
    assert result.returncode == 1 and "judge 'nosuch'" in result.stderr and "Traceback" not in result.stderr


def test_simulate_judges_enough_answers_and_refuses_an_agreement_its_judge_cannot_give(tiny_project, tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"Say something about the number {i}."}) + "\n" for i in range(5)))
    flat = tmp_path / "flat.py"
    flat.write_text("def judge(prompt, completion):\n    return 0.0\n")  # every pair a tie: votes on them are coin flips
    result = run_tether("simulate", "--judge", f"{flat}:judge", "--eval-prompts", str(eval_file), "--project", str(tiny_project))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    # 39 answers to each of 5 prompts: 195 against the starting policy's 195, at least 192 a round.
    assert "sampling 39 answers from v0 to each of 5 evaluation prompts" in result.stdout
    assert "the judge scores all 3705 pairs the same: there is nothing for votes to side with" in result.stderr and "give --noise" in result.stderr


def test_a_restart_fails_the_rounds_whose_jobs_nobody_runs_and_keeps_those_with_a_job_queued(tmp_path):
    from store.db import utcnow
    from store.jobs import add_job, fail_interrupted, start_job
    from store.rounds import add_round, fail_interrupted_rounds, get_round

    with closing(open_database(tmp_path / "t.duckdb")) as con:
        interrupted = add_round(con, 0, None)
        start_job(con, add_job(con, "ppo", {}, interrupted.id).id)  # running when the process died
        assert fail_interrupted(con, utcnow()) == 1
        assert fail_interrupted_rounds(con, utcnow()) == 1
        assert get_round(con, interrupted.id).status == "failed"

        waiting = add_round(con, 1, None)
        add_job(con, "reward_model", {}, waiting.id)  # queued: the job queue will run it, and the round goes on
        assert fail_interrupted_rounds(con, utcnow()) == 0
        assert get_round(con, waiting.id).status == "running"
