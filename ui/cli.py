"""The `tether` command: one thin verb per task, each delegating to the package that owns it."""

import sys
from pathlib import Path

import click
from tqdm import tqdm

from annotate.agreement import JudgeAgreement, agreement_with_people, project_flip_rate
from annotate.export import FORMATS, export_preferences, export_rankings
from annotate.judges import BUILT_IN, JudgeError, load_judge
from annotate.queue import SORT_KEYS
from annotate.ratings import measured_share
from annotate.simulate import UnreachableAgreement
from annotate.trust import project_reliability
from store import StoreError
from store.ai_votes import judge_annotator
from store.db import utcnow
from store.gold import agreed_pairs, gold_answers, import_gold_file, mark_gold
from store.jobs import job_metrics
from store.policies import get_policy
from store.preferences import import_preference_file
from store.prompt_files import read_prompt_file
from store.prompts import Prompt, import_prompt_file, prompts_to_generate
from store.reward_models import get_reward_model
from store.status import project_counts
from store.users import ROLES, check_new_user
from train.common.errors import ModelError
from ui.owner.auth import WeakPassword, hash_new_password
from ui.owner.backup import restore
from ui.owner.check import check_project
from ui.owner.config import OPTIMIZERS, SECTIONS, ConfigError, TetherConfig, settings_reference
from ui.owner.control import command_line_actor, run_action
from ui.owner.history import round_report, round_summary
from ui.owner.jobs import evaluate_reward_model, run_to_end, submit_judging, submit_scoring
from ui.owner.project import Project, ProjectError, init_project, load_project
from ui.owner.rollback import roll_back
from ui.owner.round import run_round
from ui.owner.round_jobs import is_held_back, submit_generation, submit_ppo, submit_reward_training
from ui.owner.round_report import scoring_kind, trust_status
from ui.owner.simulate import EVAL_PAIRS, Simulation, simulate as simulate_rounds, training_summary


class TetherGroup(click.Group):
    """Turns Tether's own errors into one-line messages instead of tracebacks."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (StoreError, ModelError, ConfigError, ProjectError, JudgeError) as e:
            raise click.ClickException(str(e)) from None


class VoteCounts(click.ParamType):
    """A comma-separated list of vote counts, each at least 1."""

    name = "N[,N...]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            counts = tuple(int(part) for part in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of whole numbers", param, ctx)
        if min(counts) < 1:
            self.fail(f"every count must be at least 1, got {value!r}", param, ctx)
        return counts


project_option = click.option(
    "--project", "project_dir", envvar="TETHER_PROJECT", default=".", show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Project directory; the TETHER_PROJECT environment variable sets it too.",
)


@click.group(cls=TetherGroup)
@click.version_option(package_name="tether")
def cli():
    """Tether: collect human preferences on model completions and turn them into a better model."""


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", metavar="ID_OR_PATH", help="Hugging Face model id or local directory [default: SmolLM2-135M-Instruct].")
def init(directory: Path, model: str | None):
    """Create a project in DIRECTORY: tether.toml and the database.

    The settings suit the hardware found: a CPU profile (short answers, small batches), or a GPU
    profile sized by the GPU's memory. Init says which it chose.

    \b
    Example:
        tether init demo
        tether init demo --model ./my-chat-model
    """
    project = init_project(directory, model)
    click.echo(f"created {project.root} (model {project.config.model.name_or_path}) with the {project.profile}; "
               f"settings are in tether.toml")
    click.echo(f"expected memory: {_expected_memory(project, [])}")


@cli.group(cls=TetherGroup)
def prompts():
    """Manage the prompts that completions are generated for."""


@prompts.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@project_option
def import_prompts(file: Path, project_dir: Path):
    """Import prompts from FILE: JSON Lines, CSV, Parquet or a datasets directory.

    Each row gives `prompt` (text) or `messages` (a chat list ending with the user's turn),
    and optionally `tags`. Prompts already in the project are skipped. One bad row stops the
    import with its file, row and field, and nothing is imported.

    \b
    Example:
        tether prompts import prompts.jsonl --project demo
    """
    project = load_project(project_dir)
    result = project.run(import_prompt_file, file, project.config.server.import_limits())
    click.echo(f"imported {result.added} prompts from {file} ({result.duplicates} already present)")


@cli.command("import-prefs")
@click.argument("file", type=click.Path(path_type=Path))
@project_option
def import_prefs(file: Path, project_dir: Path):
    """Import human preferences from FILE as votes for the chosen reply.

    Rows are Anthropic HH transcript pairs (`chosen`, `rejected`) or TRL preference rows
    (`prompt`, `chosen`, `rejected`, the prompt optional for chat lists), in JSON Lines, Parquet
    or a datasets directory. Each becomes a prompt, two completions, a pair and one vote.
    Preferences imported before are skipped. One bad row stops the import with its file, row
    and field, and nothing is imported.

    \b
    Example:
        tether import-prefs hh-rlhf.jsonl.gz --project demo
    """
    project = load_project(project_dir)
    result = project.run(import_preference_file, file, project.config.server.import_limits())
    click.echo(f"imported {result.added} comparisons from {file} ({result.duplicates} already present)")


@cli.command()
@click.option("--per-prompt", type=click.IntRange(min=2), help="Completions per prompt [default: from tether.toml].")
@click.option("--limit", type=click.IntRange(min=1), help="Generate for at most this many prompts, those with the fewest completions first.")
@click.option("--policy", "policy_version", type=int, help="Policy version to sample from [default: the newest].")
@project_option
def generate(per_prompt: int | None, limit: int | None, policy_version: int | None, project_dir: Path):
    """Sample completions for the project's prompts that policies train on, and pair them up for annotation.

    \b
    Example:
        tether generate --per-prompt 2 --limit 20 --project demo
    """
    project = load_project(project_dir)
    job = submit_generation(project, project.run, limit=limit, per_prompt=per_prompt, policy_version=policy_version)
    job = run_to_end(project, job, "generating")
    metrics = project.run(job_metrics, job.id)
    click.echo(
        f"stored {metrics['completions']:.0f} completions from policy v{job.config['policy_version']} "
        f"for {metrics['prompts']:.0f} prompts, and {metrics['pairs']:.0f} new pairs"
    )
    if held_back := _held_back(project, project.run(prompts_to_generate, 0, None)):
        click.echo(held_back)


@cli.command()
@click.option("--reward-version", type=int, help="Reward-model version to optimise against [default: the newest].")
@click.option("--policy-version", type=int, help="Policy version to start from [default: the newest].")
@project_option
def ppo(reward_version: int | None, policy_version: int | None, project_dir: Path):
    """Run PPO on the policy against a reward model and register the result as the next policy version.

    The policy is a LoRA adapter on the base model, held to it by a per-token KL penalty.
    Settings are in the [ppo] section of tether.toml.

    \b
    Example:
        tether ppo --project demo
    """
    project = load_project(project_dir)
    warn_about_length(project)
    job = submit_ppo(project, project.run, reward_version=reward_version, policy_version=policy_version)
    job = run_to_end(project, job, "PPO")
    last = project.run(job_metrics, job.id)
    click.echo(
        f"policy v{project.run(get_policy, None).version} from v{job.config['policy_version']} against reward model "
        f"v{job.config['reward_version']}: last step score {last['score']:.3f}, KL {last['kl']:.3f}, "
        f"response length {last['response_length']:.1f} tokens"
    )


@cli.command("round")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), help="How this round trains the next policy [default: [round] optimizer].")
@click.option("--reward-version", type=int, help="Reward-model version PPO optimises against [default: train a new one on every vote so far].")
@project_option
def round_command(optimizer: str | None, reward_version: int | None, project_dir: Path):
    """Run a training round: candidates for the next policy from the votes, their average registered, then pairs of it
    against the old one for annotators.

    The round starts from the newest policy, or from the one people rate best ([round]
    start_from). A reward model is trained on the votes first (or the newest reused, when the
    votes hold nothing new for it). With "auto", the default, DPO learns from the votes; with
    [round] trusted_optimizer "ppo" or "grpo", that optimises against the reward model instead
    once it has predicted votes it never saw. The round says which and why. PPO, GRPO and DPO
    run as named whatever the reward model has shown. Each trains [round] candidates policies, with their own seeds, on
    the prompts not held back. Their average ([round] register), within [round] kl_budget,
    becomes the next version, or none does and the votes carry over; a predictor rates it
    against the start by the reward model on fresh answers to held-back prompts (with register
    "confident" it rates each, and the one rated best with confidence is registered, or none). Both policies
    then answer the held-back prompts, and each new answer is paired with an old one: the votes
    on those pairs are the round's human win rate (`tether rounds`).

    \b
    Example:
        tether round --project demo
        tether round --optimizer dpo --project demo
    """
    project = load_project(project_dir)
    warn_about_length(project)
    round_ = run_round(project, reward_version=reward_version, optimizer=optimizer)
    summary = round_summary(project.run, round_.id)
    if round_.policy_to is None:
        click.echo(f"round {round_.id} from v{round_.policy_from}: {round_.note}; {training_summary(project, summary)}")
        return
    click.echo(f"round {round_.id}: policy v{round_.policy_to} from v{round_.policy_from}; {training_summary(project, summary)}; "
               f"new-against-old pairs are queued for annotators")


def warn_about_length(project: Project) -> None:
    if warning := project.config.length_warning():
        click.echo(f"warning: {warning}", err=True)


@cli.command()
@project_option
def rounds(project_dir: Path):
    """Show the round history, the ratings of every policy version, and warnings.

    Each round shows the human win rate of its new policy over the old, raw and at equal length
    (length-controlled), and its reward model's accuracy on the votes that came in after it.

    \b
    Example:
        tether rounds --project demo
    """
    project = load_project(project_dir)
    for line in round_report(project.run, project.config):
        click.echo(line)


@cli.command()
@click.argument("version", type=click.IntRange(min=0))
@project_option
def rollback(version: int, project_dir: Path):
    """Roll the policy back: register a copy of VERSION as the newest version, so the next round starts from it.

    Nothing is deleted: the versions after it keep their adapters, votes and ratings. Refused
    while a round or PPO is running.

    \b
    Example:
        tether rollback 1 --project demo
    """
    project = load_project(project_dir)
    policy = roll_back(project, project.run, version)
    click.echo(f"policy v{policy.version} is a copy of v{version}: the next round and `tether ppo` start from it")


@cli.command()
@click.option("--judge", "judge_spec", required=True, metavar="JUDGE",
              help=f"Built-in ({', '.join(BUILT_IN)}; all but concise are length-neutral), module:FUNC or PATH.py:FUNC: "
                   f"FUNC(prompt, completion) -> float, higher is better.")
@click.option("--agreement", type=click.FloatRange(0.5, 1, min_open=True, max_open=True), default=0.7, show_default=True,
              help="Share of votes that side with the judge on the starting policy's pairs it does not tie (a vote on a tie "
                   "sides with it half the time); it sets the noise T. "
                   "0.7 is how often careful human labellers agree with each other.")
@click.option("--noise", type=click.FloatRange(min=0),
              help="T: an annotator prefers A with probability sigmoid((judge(A) - judge(B)) / T); 0 never errs. "
                   "When given, it overrides --agreement.")
@click.option("--annotators", type=click.IntRange(min=1), default=3, show_default=True, help="Simulated annotators, voting in turn.")
@click.option("--labels-per-round", type=VoteCounts(), default="96", show_default=True,
              help="Votes cast before each round; the reward model learns little from fewer. A comma-separated list gives "
                   "each round its own, the last for every round after: 96,192,576 casts each round twice the votes before it.")
@click.option("--rounds", "round_count", type=click.IntRange(min=0), default=3, show_default=True,
              help="Rounds to run; 0 casts --labels-per-round votes on the starting policy's answers and trains nothing.")
@click.option("--eval-prompts", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Prompt file the judge compares policies on; keep it apart from the project's prompts.")
@click.option("--eval-samples", type=click.IntRange(min=1),
              help=f"Answers per evaluation prompt from each policy [default: enough for {EVAL_PAIRS} judged pairs a round, "
                   f"to tell a 60% win rate from 50%].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the annotators' noise and of the evaluation samples.")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), help="How each round trains the next policy [default: [round] optimizer].")
@click.option("--strategy", type=click.Choice(list(SORT_KEYS)),
              help="Which pairs the simulated annotators get, as [queue] strategy: run once with each to compare them "
                   "[default: [queue] strategy].")
@click.option("--report", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Also append each round's figures to this file, one JSON object per line.")
@click.option("--judge-candidates", is_flag=True,
              help="Judge every candidate of each round against the round's start, not only the registered one (or, where none "
                   "was, the one the predictor rated best): an evaluation each, to measure the predictor.")
@click.option("--baseline", type=click.IntRange(min=0), metavar="VERSION",
              help="The policy version every round's win rate is measured over [default: the one serving when it starts]; "
                   "--baseline 0 goes on with a run that was cut off, over v0 as before.")
@project_option
def simulate(judge_spec: str, agreement: float, noise: float | None, annotators: int, labels_per_round: tuple[int, ...], round_count: int,
             eval_prompts: Path, eval_samples: int | None, seed: int, optimizer: str | None, strategy: str | None, report: Path | None,
             judge_candidates: bool, baseline: int | None, project_dir: Path):
    """Run the loop with simulated annotators: votes from a judge plus noise, then a round, again and again.

    The noise is set so that votes on pairs of the starting policy's evaluation answers that the
    judge tells apart side with it --agreement of the time, as people's do with each other; it
    prints the T chosen. The simulated annotators take pairs from the same queue, and vote
    through the same path, as people in the app; when the queue runs dry the newest policy
    answers more prompts. After each round the judge compares the new policy with the starting
    one and with its parent on the evaluation prompts, and the round's line says how often its votes sided with the judge,
    the KL to the starting model on the new policy's evaluation answers, the share of answers
    that ended, and where its time went. At the end the last round's pairs get votes too, and
    the round table of `tether rounds` follows. On a project with rounds already it goes on
    from them: the votes cast since the last done round began count towards the next. Each
    round's candidates are listed with the predictor's rating of each and the judge's win rate
    over the round's start of the one the round registered, or where none was, of the one the
    predictor rated best.

    \b
    Example:
        tether simulate --judge concise --rounds 3 --eval-prompts eval.jsonl --project demo
    """
    project = load_project(project_dir)
    warn_about_length(project)
    prompts = [p.messages for p in read_prompt_file(eval_prompts, project.config.server.import_limits())]
    sim = Simulation(load_judge(judge_spec), prompts, noise=noise, agreement=agreement, annotators=annotators,
                     labels_per_round=labels_per_round, rounds=round_count, eval_samples=eval_samples, seed=seed,
                     optimizer=optimizer, strategy=strategy, report=report, judge_candidates=judge_candidates,
                     baseline=baseline)
    try:
        simulate_rounds(project, sim, click.echo)
    except UnreachableAgreement as e:
        raise click.ClickException(f"{e}; give --noise to set the noise yourself") from None


@cli.group(cls=TetherGroup)
def gold():
    """Gold pairs, whose better answer is known, and how far to trust each annotator.

    The queue mixes gold pairs in at [queue] gold_share, each served to an annotator once. Each
    annotator's reliability, the chance their vote picks the better answer, is estimated from
    their gold answers and from agreement with others (Dawid-Skene); `tether gold status` shows it.
    """


@gold.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@project_option
def gold_import(file: Path, project_dir: Path):
    """Import gold pairs from FILE, a preference file whose chosen reply is the known answer.

    Rows are as `tether import-prefs` reads them (HH transcripts, or `prompt`, `chosen`,
    `rejected`): a row with no `chosen` has no answer and is refused. One bad row stops the
    import with its file, row and field, and nothing is imported. Gold pairs imported before are
    skipped.

    \b
    Example:
        tether gold import gold.jsonl --project demo
    """
    project = load_project(project_dir)
    result = project.run(import_gold_file, file, command_line_actor(), utcnow(), project.config.server.import_limits())
    click.echo(f"imported {result.added} gold pairs from {file} ({result.duplicates} already present)")


@gold.command("agreed")
@click.option("--min-votes", type=click.IntRange(min=2), help="Votes, all for the same answer, a pair needs [default: [queue] overlap_votes].")
@project_option
def gold_agreed(min_votes: int | None, project_dir: Path):
    """Mark as gold every pair on which at least --min-votes people voted, all for the same answer.

    \b
    Example:
        tether gold agreed --min-votes 3 --project demo
    """
    project = load_project(project_dir)
    wanted = min_votes or project.config.queue.overlap_votes
    marked = project.run(lambda con: mark_gold(con, agreed_pairs(con, wanted), "agreed", command_line_actor(), utcnow()))
    click.echo(f"marked {marked} pairs gold: those with {wanted} or more votes, all alike")


@gold.command("mark")
@click.argument("pair_id", type=int)
@click.argument("answer", type=click.Choice(["a", "b"]))
@project_option
def gold_mark(pair_id: int, answer: str, project_dir: Path):
    """Mark pair PAIR_ID gold, ANSWER ('a' or 'b', its completion_a or completion_b as the export names them) the better.

    \b
    Example:
        tether gold mark 42 b --project demo
    """
    project = load_project(project_dir)
    project.run(mark_gold, {pair_id: answer}, "operator", command_line_actor(), utcnow())
    click.echo(f"pair {pair_id} is gold, answer {answer}")


@gold.command("status")
@project_option
def gold_status(project_dir: Path):
    """Show each annotator's estimated reliability, their gold answers, and who is flagged.

    \b
    Example:
        tether gold status --project demo
    """
    project = load_project(project_dir)
    reliability, gold_count = project.run(lambda con: (project_reliability(con), len(gold_answers(con))))
    below = project.config.queue.flag_reliability_below
    click.echo(f"{gold_count} gold pairs; annotators below a reliability of {below:.2f} are flagged")
    click.echo(f"{'annotator':<20}{'reliability':>12}{'measured on':>13}{'gold right':>12}")
    for r in reliability.values():
        flag = "  FLAGGED" if r.reliability < below else ""
        click.echo(f"{r.annotator:<20}{r.reliability:>12.2f}{r.informative_votes:>13}{f'{r.gold_correct}/{r.gold_answered}':>12}{flag}")


@cli.group(cls=TetherGroup)
def rm():
    """Train, evaluate and apply reward models."""


@rm.command("train")
@click.option("--include-imported", is_flag=True, default=None, help="Also train on imported preference data [default: from tether.toml].")
@project_option
def rm_train(include_imported: bool | None, project_dir: Path):
    """Train a reward model on the project's resolved comparisons and register it as a new version.

    Ties, both-bad and unresolved pairs are left out; a share of the prompts is held out for
    evaluation. Settings are in the [reward_model] section of tether.toml.

    \b
    Example:
        tether rm train --project demo
    """
    project = load_project(project_dir)
    job = submit_reward_training(project, project.run, include_imported=include_imported)
    job = run_to_end(project, job, "training")
    reward_model = project.run(get_reward_model, None)
    m = reward_model.metrics  # with kind "auto", the figures of the model that steers
    trained = (f"trained on {m['pairs_train']} pairs in {m['train_seconds']:.1f} s" + (
        f" after reading {m['features_read']} answers' features ({m['features_cached']} cached) in {m['feature_seconds']:.0f} s"
        if m.get("features_read") is not None else
        (f" and {m['rankings_train']} rankings" if m.get("rankings_train") else "") + f" ({m['truncated']} truncated), {m['pairs_per_second']:.2f} rows/s"
    ))
    click.echo(
        f"reward model v{reward_model.version}, {scoring_kind(reward_model)}: held-out accuracy {measured_share(m['eval_accuracy'], m['pairs_eval'])}"
        + ("" if m["eval_calibration_error"] is None else f" (calibration error {m['eval_calibration_error']:.3f})")
        + f", {m['heads']} heads, {trained}"
    )
    click.echo(f"reward model v{reward_model.version}: {trust_status(reward_model, project.config.reward_model)}")


@rm.command("eval")
@click.option("--data", "data_file", type=click.Path(path_type=Path), required=True, help="Preference file: Anthropic HH or TRL format.")
@click.option("--version", type=int, help="Reward-model version [default: the newest].")
@project_option
def rm_eval(data_file: Path, version: int | None, project_dir: Path):
    """Report a reward model's pairwise accuracy on a preference file.

    \b
    Example:
        tether rm eval --data held-out.jsonl --project demo
    """
    project = load_project(project_dir)
    version_row = project.run(get_reward_model, version)
    with tqdm(unit="response", desc="scoring", file=sys.stderr) as bar:
        result = evaluate_reward_model(project, version_row, data_file, on_scored=bar.update)
    click.echo(
        f"reward model v{version_row.version} on {data_file}: accuracy {measured_share(result.accuracy, result.pairs)}, "
        f"mean margin {result.mean_margin:.3f}, calibration error {result.calibration_error:.3f} ({result.truncated} truncated)"
    )


@rm.command("score")
@click.option("--version", type=int, help="Reward-model version [default: the newest].")
@project_option
def rm_score(version: int | None, project_dir: Path):
    """Score every completion with a reward model and store the normalised rewards.

    The `uncertain` queue strategy serves the pairs whose scores are closest first, and `active` those
    on which the reward model's heads disagree most.

    \b
    Example:
        tether rm score --project demo
    """
    project = load_project(project_dir)
    job = submit_scoring(project, project.run, version)
    job = run_to_end(project, job, "scoring")
    scored = project.run(job_metrics, job.id)["scored"]
    click.echo(f"stored rewards from reward model v{job.config['reward_version']} on {scored:.0f} completions")


@cli.command()
@click.option("--limit", type=click.IntRange(1), metavar="N", help="Judge at most N pairs [default: every pair it has not voted on].")
@project_option
def judge(limit: int | None, project_dir: Path):
    """Have an AI judge vote on the pairs it has not voted on yet, and say how far it agrees with people.

    The judge is [judge] model (by default the project's base model, adapters off). It is asked
    [judge] template about each pair in both orders, and votes for the answer its logits of "A" and
    "B" favour once the two orders are averaged. Its votes are stored as annotator ai:MODEL with
    source 'ai': they never count as people's votes, and train a reward model or DPO only with
    [reward_model] ai_votes = "include" or "weight". Agreement is on the pairs both it and people
    voted on, where people's majority is a or b, with a 95% Wilson interval.

    \b
    Example:
        tether judge --limit 100 --project demo
    """
    project = load_project(project_dir)
    job = run_to_end(project, submit_judging(project, project.run, limit), "judging")
    m = project.run(job_metrics, job.id)
    cut = f"{m['prompts_cut']:.0f} conversations cut to fit [judge] max_length"
    if m["answers_cut"]:
        cut += f", {m['answers_cut']:.0f} pairs' answers too"
    click.echo(f"{job.config['annotator']} judged {m['judged']:.0f} pairs and added {m['votes_added']:.0f} votes ({cut}); "
               f"it picked the first-placed answer in {m['first_place_share']:.1%} of single-order questions")
    annotator = judge_annotator(project.config.judge_model().name_or_path)
    click.echo(f"agreement with people: {project.run(agreement_with_people).get(annotator, JudgeAgreement(0, 0))}")


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


@cli.group(cls=TetherGroup)
def users():
    """Manage the accounts that sign in to the app. With the app running, each command goes through it."""


def read_password(password_file) -> str:
    """From --password-file's first line, a prompt, or standard input's first line."""
    if password_file is not None:
        return password_file.readline().rstrip("\n")
    if sys.stdin.isatty():
        return click.prompt("Password", hide_input=True, confirmation_prompt=True)
    return sys.stdin.readline().rstrip("\n")


def new_password_hash(password_file) -> str:
    try:
        return hash_new_password(read_password(password_file))
    except WeakPassword as e:
        raise click.ClickException(str(e)) from None


password_file_option = click.option("--password-file", type=click.File("r"), help="Read the password from this file's first line.")


@users.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True, help="Annotators vote; operators also manage data and training.")
@password_file_option
@project_option
def add_user_command(name: str, role: str, password_file, project_dir: Path):
    """Add an account. The password comes from a prompt, standard input or --password-file.

    \b
    Example:
        tether users add alice --role annotator
        echo "$PASSWORD" | tether users add bob --role operator
    """
    check_new_user(name, role)  # before asking for a password
    project = load_project(project_dir)
    run_action(project, "add_user", name, role, new_password_hash(password_file), command_line_actor())
    click.echo(f"added {role} {name}")


@users.command("list")
@project_option
def list_users_command(project_dir: Path):
    """List the accounts: name, role, and whether each is disabled.

    \b
    Example:
        tether users list --project demo
    """
    for user in run_action(load_project(project_dir), "users"):
        click.echo(f"{user['name']:<24}{user['role']:<12}{'disabled' if user['disabled'] else 'active'}")


@users.command("disable")
@click.argument("name")
@project_option
def disable_user_command(name: str, project_dir: Path):
    """Stop an account from signing in; its open sessions end at once.

    \b
    Example:
        tether users disable alice
    """
    run_action(load_project(project_dir), "set_disabled", name, True, command_line_actor())
    click.echo(f"disabled {name}")


@users.command("enable")
@click.argument("name")
@project_option
def enable_user_command(name: str, project_dir: Path):
    """Let a disabled account sign in again.

    \b
    Example:
        tether users enable alice
    """
    run_action(load_project(project_dir), "set_disabled", name, False, command_line_actor())
    click.echo(f"enabled {name}")


@users.command("passwd")
@click.argument("name")
@password_file_option
@project_option
def passwd_command(name: str, password_file, project_dir: Path):
    """Give an account a new password, from a prompt, standard input or --password-file.

    \b
    Example:
        echo "$NEW_PASSWORD" | tether users passwd alice
    """
    project = load_project(project_dir)
    run_action(project, "set_password", name, new_password_hash(password_file), command_line_actor())
    click.echo(f"set a new password for {name}")


@users.command("log")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1), help="How many changes to show.")
@project_option
def account_log_command(limit: int, project_dir: Path):
    """Show the newest changes to accounts: when, which account, what, and by whom.

    \b
    Example:
        tether users log --limit 20
    """
    for event in run_action(load_project(project_dir), "account_log", limit):
        click.echo(f"{event['at']}  {event['account']:<24}{event['action']:<36}by {event['actor']}")


@cli.command("backup")
@click.argument("dest", type=click.Path(path_type=Path))
@project_option
def backup_command(dest: Path, project_dir: Path):
    """Copy the project (database, settings and every registered adapter) into DEST, a new directory.

    With the app running, the copy is taken through it while annotators go on voting: it holds
    every vote stored before it began.

    \b
    Example:
        tether backup /backups/tether-$(date +%F) --project demo
    """
    taken = run_action(load_project(project_dir), "backup", str(dest.resolve()))
    click.echo(f"backed up {taken['votes']} votes and {len(taken['adapters'])} adapters to {dest}")


@cli.command("check-queue")
@project_option
def check_queue_command(project_dir: Path):
    """Compare the running server's queue in memory with one rebuilt from the database; exit 1 if they differ.

    The server keeps the queue (votes and leases per pair, what each annotator has seen) in
    memory and rebuilds it from the database at start; the two must always agree.

    \b
    Example:
        tether check-queue --project demo
    """
    differences = run_action(load_project(project_dir), "check_queue")
    if not differences:
        click.echo("the queue in memory matches the database")
        return
    for part, both in differences.items():
        click.echo(f"{part} differs:\n  in memory: {both['held']}\n  rebuilt:   {both['rebuilt']}", err=True)
    sys.exit(1)


@cli.command("check")
@project_option
def check_command(project_dir: Path):
    """Check that the project is whole, and say what is not; exit 1 unless it is whole.

    Reads and changes nothing: the database (every table read back, the references between
    them), the settings file, every registered version's files against the digests taken as it
    was registered, the votes frozen for later training, the features cache, and what nothing
    names in the folders Tether owns. With the app running, it checks through it while annotators vote.

    \b
    Example:
        tether check --project demo
    """
    root = project_dir.resolve()
    try:
        project = load_project(root)
    except ConfigError:  # the check reports the settings' problem with the rest
        project = Project(root, TetherConfig())
    report = run_action(project, "check")
    if not report["problems"]:
        click.echo(f"{root} is whole. Checked:\n" + "\n".join(f"  {line}" for line in report["checked"]))
        return
    count = len(report["problems"])
    click.echo(f"{root} is not whole: {count} problem{'s' if count > 1 else ''}\n"
               + "\n".join(f"  - {line}" for line in report["problems"]), err=True)
    sys.exit(1)


@cli.command("restore")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@project_option
def restore_command(src: Path, project_dir: Path):
    """Make a project from a backup, in a new or empty directory, and check it; it never overwrites a project.

    \b
    Example:
        tether restore /backups/tether-2026-11-23 --project demo-restored
    """
    restored = restore(src, project_dir)
    click.echo(f"restored {restored.votes} votes and {len(restored.adapters)} adapters into {project_dir.resolve()}")
    project = load_project(project_dir)
    if problems := project.run(check_project, project).problems:
        click.echo("but the restored project is not whole (`tether check`):\n" + "\n".join(f"  - {p}" for p in problems), err=True)
        sys.exit(1)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on; 0.0.0.0 for every interface.")
@click.option("--port", default=7860, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@project_option
def serve(host: str, port: int, project_dir: Path):
    """Start the annotation app. It holds the database while it runs.

    \b
    Example:
        tether serve --project demo --port 7860
    """
    from ui.web.app import run  # Gradio takes seconds to import

    project = load_project(project_dir)
    run(project, host, port)


@cli.command()
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="hf", show_default=True,
              help="hf: a datasets directory for load_from_disk; parquet: one file; jsonl: one JSON object a line.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Where to write it; must not exist yet.")
@click.option("--include-ties", is_flag=True, help="Write every vote instead, one row each, ties and both-bad included.")
@click.option("--min-agreement", type=click.FloatRange(0, 1), metavar="SHARE",
              help="Leave out pairs where a smaller share of the votes backs the majority.")
@click.option("--include-ai", is_flag=True,
              help="Also the AI judge's votes (`tether judge`), on the pairs no person voted on; their rows have source 'ai'.")
@click.option("--rankings", type=click.Path(path_type=Path), metavar="PATH",
              help="Also write the rankings of K answers ([queue] answers_per_task) to PATH, in the same format, one row "
                   "each: the prompt, the answers best first, their ranks (equal ranks are a tie), the annotator. Their "
                   "K(K-1)/2 pairs are votes in --out.")
@project_option
def export(fmt: str, out: Path, include_ties: bool, min_agreement: float | None, include_ai: bool, rankings: Path | None,
           project_dir: Path):
    """Export the votes as preference data for TRL: one chosen/rejected row per pair, by majority.

    People's votes only, unless --include-ai: the AI judge's votes then decide the pairs no person voted on.
    A ranking of K answers counts as a vote on each of its pairs; --rankings writes the rankings themselves.

    \b
    Example:
        tether export --format hf --out prefs --project demo
        tether export --format jsonl --out votes.jsonl --include-ties --min-agreement 0.6
        tether export --format jsonl --out votes.jsonl --include-ties --rankings rankings.jsonl
    """
    project = load_project(project_dir)
    if rankings is not None and rankings.exists():  # checked first, so that neither file is written
        raise click.ClickException(f"{rankings} already exists: choose another path or remove it first")
    result = project.run(export_preferences, out, fmt, include_ties, min_agreement, include_ai)
    if rankings is not None:
        click.echo(f"wrote {project.run(export_rankings, rankings, fmt)} rankings to {rankings}")
    if include_ties:
        click.echo(f"wrote {result.rows} votes on {result.pairs} pairs to {out}, ties and both-bad included "
                   f"({result.below_agreement} pairs below agreement left out)")
    else:
        click.echo(f"wrote {result.rows} preference pairs to {out} ({result.unresolved} unresolved left out, "
                   f"{result.below_agreement} below agreement, {result.tie_or_both_bad} tie/both-bad left out)")


@cli.command()
@project_option
def status(project_dir: Path):
    """Say where and in what precision model jobs run, count the project's prompts, completions, pairs and
    votes, and list model versions.

    \b
    Example:
        tether status --project demo
    """
    from train.runtime.hardware import describe_device, uses_bf16

    project = load_project(project_dir)
    counts = project.run(project_counts)
    active = project.run(prompts_to_generate, 0, None)
    config = project.config
    autocast = {name: "on" if uses_bf16(precision) else "off"
                for name, precision in (("reward model", config.reward_model.precision), ("PPO", config.ppo.precision))}
    rows = [
        ("project", str(project.root)),
        ("model", config.model.name_or_path),
        ("device", describe_device(config.model)),
        ("precision", f"{config.model.dtype} weights, quantization {config.model.quantization}; bf16 autocast "
                      f"{autocast['reward model']} in reward-model training, {autocast['PPO']} in PPO"),
        ("processes", f"{config.worker.processes()} per model job ([worker] gpus = {config.worker.gpus})"),
        ("memory", _expected_memory(project, [p.messages for p in active])),
        ("schema", f"version {counts.schema_version}"),
        ("prompts", f"{counts.prompts} ({counts.active_prompts} active)"),
        *([("held back", held_back)] if (held_back := _held_back(project, active)) else []),
        ("completions", str(counts.completions)),
        ("pairs", f"{counts.pairs} ({counts.pairs_wanting_votes} wanting votes)"),
        ("votes", str(counts.votes)),
        *([("rankings", f"{counts.rankings}, of {counts.tasks} tasks to rank; each counts in votes as a vote on each of its pairs")]
          if counts.tasks else []),
        ("flip rate", project.run(project_flip_rate).in_use(config.reward_model.flip_rate)),
        ("AI votes", _ai_votes(counts.ai_votes, project.run(agreement_with_people))),
        ("policies", _versions(counts.policy_versions)),
        ("reward models", _versions(counts.reward_model_versions)),
    ]
    for name, value in rows:
        click.echo(f"{name:<14}{value}")


@cli.command()
@click.option("--section", type=click.Choice(SECTIONS), help="Show only this section of tether.toml.")
def settings(section: str | None):
    """Show every setting of tether.toml: its section, default, type and what it does.

    Read from the settings' own definitions, so it is never out of date. A project's own values
    are in its tether.toml, which `tether init` writes with the same help as comments.

    \b
    Example:
        tether settings
        tether settings --section ppo
    """
    click.echo(settings_reference(section))


def _held_back(project: Project, active: list[Prompt]) -> str | None:
    """How many of the active prompts no optimiser trains on, kept to compare versions on, and why `generate` gave
    them no completions; None where none is."""
    share = project.config.round.held_back_share
    held = sum(is_held_back(prompt, share) for prompt in active)
    if not held:
        return None
    one = held == 1
    return (f"{held} of {len(active)} active prompts {'is' if one else 'are'} held back from training to compare versions on "
            f"([round] held_back_share = {share}): no pairs are generated for {'it' if one else 'them'} outside a round, "
            f"which pairs its new version against the old there")


def _expected_memory(project: Project, prompts: list) -> str:
    """The round's expected peak memory (train.runtime.memory), or why it cannot be worked out."""
    from train.runtime.hardware import detect_hardware, machine_memory_gb
    from train.runtime.memory import describe, round_memory  # torch and transformers take seconds to import

    try:
        jobs, prompt_tokens, on_gpu = round_memory(project.config, project.config.round.optimizer, prompts)
        return describe(jobs, prompt_tokens, on_gpu, detect_hardware().memory_gb if on_gpu else machine_memory_gb())
    except (OSError, ValueError, ModelError) as e:  # a model whose config or tokenizer cannot be read here
        return f"unknown: {' '.join(str(e).split())}"


def _ai_votes(count: int, agreement: dict[str, JudgeAgreement]) -> str:
    """How many votes AI judges cast, and each one's agreement with people."""
    return "; ".join([str(count)] + [f"{judge}: agreement with people {a}" for judge, a in agreement.items()])


def _versions(versions: list[int]) -> str:
    return ", ".join(f"v{v}" for v in versions) or "none"


def main():
    cli(prog_name="tether")
