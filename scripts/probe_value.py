"""PPO's value function as a baseline: how much of the returns' variance it explains, in this tree and in another.

With GAE's lambda at 1, Tether's default, an advantage is the response's return minus the value, so
the value is only a baseline: it cannot bias the policy gradient, and all it changes is the
gradient's variance. Each step this measures that share of variance on the fresh rollout, with the
values the run had learnt before it:

    explained variance = 1 - Var(returns - values) / Var(returns)   over the batch's response tokens

(1: the value predicts every return; 0: no better than a constant; below 0: worse than none.) The
first step's values are the zero-initialised head's, so its share is 0 in every arm; the figure is
the mean over the later steps. The step's and its update's seconds are printed too.

Both arms run PPO with the product's defaults on the default model, against the same reward model,
the product's default kind (a head on the base's features), trained once into --workdir on the
first --pairs comparisons of the HH file, on prompts from the file's last --prompts comparisons,
which it never saw. --baseline DIR runs another checkout's PPO beside this one's,
alternating, once for each --seeds.

    .venv/bin/python scripts/probe_value.py --baseline /tmp/before --seeds 0 1
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HH_FILE = ROOT.parent / "shared" / "data" / "hh-rlhf-harmless-1800.jsonl.gz"


def prepare(workdir: Path, options: argparse.Namespace) -> None:
    """The reward model in workdir/reward, and the held-out prompts in workdir/prompts.json; once."""
    if (workdir / "prompts.json").exists():
        return
    from store.pref_files import read_preference_file
    from train.config import DEFAULT_MODEL, ModelConfig, RewardModelConfig
    from train.head import train_head_model
    from train.models import resolve_model_path
    from train.snapshot import PreferenceRow

    comparisons = read_preference_file(HH_FILE)
    rows = [PreferenceRow(c.prompt.messages, c.chosen, c.rejected) for c in comparisons[: options.pairs]]
    model_path = resolve_model_path(DEFAULT_MODEL)
    train_head_model(model_path, rows, [], RewardModelConfig(kind="head"), workdir / "reward", base=ModelConfig())
    prompts = [c.prompt.messages for c in comparisons[-options.prompts :]]
    (workdir / "prompts.json").write_text(json.dumps({"model_path": model_path, "prompts": prompts}))


def explained_variance(returns, values, mask) -> float:
    import torch

    returns, errors = returns[mask.bool()], (returns - values)[mask.bool()]
    return float(1 - errors.var() / returns.var().clamp(min=torch.finfo(returns.dtype).tiny))


def arm(workdir: Path, seed: int, steps: int) -> None:
    """One run of PPO in this (child) process, on whatever `train` is first on its path; one JSON line on stdout."""
    from tqdm import tqdm

    import train.ppo
    from train.config import GenerationConfig, ModelConfig, PPOConfig
    from train.models import load_model

    setup = json.loads((workdir / "prompts.json").read_text())
    shares: list[float] = []
    ppo_step = train.ppo.ppo_step

    def measured_step(*args, **kwargs):
        stats, rollout = ppo_step(*args, **kwargs)  # the rollout's values are those before this step's update
        shares.append(explained_variance(rollout.returns, rollout.values, rollout.response_mask))
        return stats, rollout

    train.ppo.ppo_step = measured_step  # train_ppo looks it up in its module at each step
    model, tokenizer = load_model(ModelConfig(name_or_path=setup["model_path"]))
    config = PPOConfig(steps=steps, seed=seed, max_new_tokens=GenerationConfig().max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="probe-value-") as scratch, tqdm(total=steps, desc=f"PPO, seed {seed}", unit="step") as bar:
        history = train.ppo.train_ppo(model, tokenizer, setup["prompts"], workdir / "reward", config, Path(scratch) / "policy",
                                      on_step=lambda _: bar.update())["steps"]
    print(json.dumps({"explained_variance": shares, "score": [s["score"] for s in history], "seconds": [s["seconds"] for s in history],
                      "update_seconds": [s["update_seconds"] for s in history], "source": train.ppo.__file__}))


def run(checkout: Path, workdir: Path, seed: int, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, str(Path(__file__).resolve()), "--arm", "--workdir", str(workdir), "--seed", str(seed), "--steps", str(steps)]
    print(f"running {checkout} with seed {seed} ...", file=sys.stderr, flush=True)
    output = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="another checkout of Tether whose PPO runs beside this one's")
    parser.add_argument("--pairs", type=int, default=400, help="HH comparisons the reward model trains on [default: 400]")
    parser.add_argument("--prompts", type=int, default=200, help="HH prompts, from the file's end, PPO samples on [default: 200]")
    parser.add_argument("--steps", type=int, default=10, help="PPO steps a run [default: 10]")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="a run of each arm for each seed [default: 0]")
    parser.add_argument("--workdir", type=Path, help="where the reward model and prompts are kept [default: a new temporary one]")
    parser.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.arm:  # Tether from the PYTHONPATH that run() gives, this tree's or the baseline's
        return arm(options.workdir, options.seed, options.steps)
    sys.path.insert(0, str(ROOT))
    if options.steps < 2:
        parser.error("--steps must be at least 2: the first step's values are 0 in every arm, so the figure is over the later ones")
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="probe-value-"))
    workdir.mkdir(parents=True, exist_ok=True)
    prepare(workdir, options)
    arms = {"this": ROOT} | ({"baseline": options.baseline.resolve()} if options.baseline else {})
    results: dict[str, list[dict]] = {name: [] for name in arms}
    for seed in options.seeds:
        for name, checkout in arms.items():
            results[name].append(run(checkout, workdir, seed, options.steps))
            later = results[name][-1]["explained_variance"][1:]
            print(f"{name} seed {seed} ({results[name][-1]['source']}): explained variance by step {[round(x, 3) for x in results[name][-1]['explained_variance']]}, "
                  f"mean past step 1 {statistics.mean(later):.3f}", flush=True)
    for name, runs in results.items():
        later = [x for r in runs for x in r["explained_variance"][1:]]
        seconds = statistics.median(s for r in runs for s in r["seconds"][1:])
        update = statistics.median(s for r in runs for s in r["update_seconds"][1:])
        print(f"{name}: explained variance past step 1 {statistics.mean(later):.3f} (median {statistics.median(later):.3f}, "
              f"{len(later)} steps); median step {seconds:.1f} s, of it the update {update:.1f} s")
    if options.baseline:
        ratio = lambda key: statistics.median(s for r in results["this"] for s in r[key][1:]) / statistics.median(  # noqa: E731
            s for r in results["baseline"] for s in r[key][1:])
        print(f"this / baseline: step time {ratio('seconds'):.2f}x, update time {ratio('update_seconds'):.2f}x")


if __name__ == "__main__":
    main()
