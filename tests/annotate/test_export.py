import json
import math
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig, RewardTrainer

import annotate.export
from annotate.export import ExportError, export_preferences
from store import open_database, transaction
from store.completions import NewCompletion, NewPair, add_completions, add_pairs
from store.prompt_files import NewPrompt
from store.prompts import add_prompts, prompts_to_generate
from tests.conftest import run_tether, vote_through_queue

START = datetime(2025, 3, 1, 9, 0)
STRENGTHS = ("much", "slight", None)

# One pair per plan: annotator i casts plan[i] on it. Resolved: 0 (a), 1 (b), 2 (a, 2 of 3),
# 6 (b, 3 of 3); unresolved: 3; tie or both-bad majorities: 4, 5.
PLANS = [["a"], ["b"], ["a", "b", "a"], ["a", "b"], ["tie"], ["both_bad", "both_bad", "a"], ["b", "b", "b"]]


def build(project: Path, plans: list[list[str]], policy: int | None = 0) -> list[tuple[int, int, int]]:
    """A prompt and a pair per plan, voted on through the real queue; (prompt, a, b) ids per pair.

    Pair k's completions say "answer k A" and "answer k B". Annotator i votes at START + i hours
    with strength STRENGTHS[i % 3], and annotator 0 leaves a comment.
    """
    with closing(open_database(project / "tether.duckdb")) as con:
        add_prompts(con, [NewPrompt([{"role": "user", "content": f"Question {k}?"}], "test") for k in range(len(plans))])
        prompt_ids = [p.id for p in prompts_to_generate(con, 0, None)]
        with transaction(con):
            completions = add_completions(con, [
                NewCompletion(prompt_id, policy, f"answer {k} {side}", 3, True, {})
                for k, prompt_id in enumerate(prompt_ids) for side in "AB"
            ])
            ids = [(prompt_id, a.id, b.id) for prompt_id, a, b in zip(prompt_ids, completions[0::2], completions[1::2])]
            add_pairs(con, [NewPair(p, a, b, "test", len(plan)) for (p, a, b), plan in zip(ids, plans)])
        for i in range(max(len(plan) for plan in plans)):
            def choose(assignment, i=i):
                choice = plans[int(assignment.left_text.split()[1])][i]
                screen = {"a": "left" if assignment.left_text.endswith("A") else "right"}
                screen["b"] = "right" if screen["a"] == "left" else "left"
                return screen.get(choice, choice), STRENGTHS[i % 3], "ünïcode, 好" if i == 0 else None

            vote_through_queue(con, f"annotator{i}", choose, START + timedelta(hours=i))
    return ids


def export(project: Path, out: Path, fmt: str = "jsonl", **options):
    with closing(open_database(project / "tether.duckdb")) as con:
        return export_preferences(con, out, fmt, **options)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_pairs_resolve_by_majority_and_the_rest_are_counted_and_left_out(tiny_project, tmp_path):
    ids = build(tiny_project, PLANS)
    result = export(tiny_project, tmp_path / "prefs.jsonl")
    assert vars(result) == {"rows": 4, "pairs": 4, "resolved": 4, "unresolved": 1, "tie_or_both_bad": 2, "below_agreement": 0}

    rows = read_jsonl(tmp_path / "prefs.jsonl")
    assert [(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows] == [
        ("answer 0 A", "answer 0 B"), ("answer 1 B", "answer 1 A"), ("answer 2 A", "answer 2 B"), ("answer 6 B", "answer 6 A"),
    ]
    prompt_id, a, b = ids[2]
    assert rows[2] == {
        "prompt": [{"role": "user", "content": "Question 2?"}],
        "chosen": [{"role": "assistant", "content": "answer 2 A"}],
        "rejected": [{"role": "assistant", "content": "answer 2 B"}],
        "pair_id": rows[2]["pair_id"],
        "prompt_id": prompt_id,
        "chosen_completion_id": a,
        "rejected_completion_id": b,
        "chosen_policy": 0,
        "rejected_policy": 0,
        "annotators": ["annotator0", "annotator2"],  # annotator1 voted for b
        "strengths": ["much", None],
        "votes": 3,
        "agreement": pytest.approx(2 / 3),
        "source": "app",
        "time": "2025-03-01T11:00:00",
    }
    prompt_id, a, b = ids[6]
    assert (rows[3]["chosen_completion_id"], rows[3]["rejected_completion_id"], rows[3]["agreement"]) == (b, a, 1.0)
    assert rows[3]["strengths"] == ["much", "slight", None]


def test_ties_and_both_bad_appear_only_in_the_raw_export(tiny_project, tmp_path):
    build(tiny_project, PLANS)
    result = export(tiny_project, tmp_path / "votes.jsonl", include_ties=True)
    assert (result.rows, result.pairs, result.below_agreement) == (14, 7, 0)

    text = (tmp_path / "votes.jsonl").read_text(encoding="utf-8")
    assert "ünïcode, 好" in text  # written as is, not \u-escaped
    rows = read_jsonl(tmp_path / "votes.jsonl")
    by_pair: dict[str, list[str]] = {}
    for row in sorted(rows, key=lambda r: r["time"]):
        by_pair.setdefault(row["completion_a"][0]["content"], []).append(row["choice"])
    assert by_pair == {f"answer {k} A": plan for k, plan in enumerate(PLANS)}
    tie = next(r for r in rows if r["choice"] == "tie")
    assert tie["strength"] is None and tie["annotator"] == "annotator0" and tie["comment"] == "ünïcode, 好"
    assert tie["completion_b"] == [{"role": "assistant", "content": "answer 4 B"}]
    assert set(tie) == {
        "prompt", "completion_a", "completion_b", "choice", "strength", "comment", "annotator", "pair_id",
        "prompt_id", "completion_a_id", "completion_b_id", "policy_a", "policy_b", "source", "time",
    }


def test_min_agreement_leaves_out_split_pairs(tiny_project, tmp_path):
    build(tiny_project, PLANS)
    result = export(tiny_project, tmp_path / "prefs.jsonl", min_agreement=0.7)
    assert (result.rows, result.unresolved, result.tie_or_both_bad, result.below_agreement) == (3, 1, 2, 1)
    assert [r["chosen"][0]["content"] for r in read_jsonl(tmp_path / "prefs.jsonl")] == ["answer 0 A", "answer 1 B", "answer 6 B"]

    # In the raw export every vote of a pair below the bar goes, those with no majority included.
    raw = export(tiny_project, tmp_path / "votes.jsonl", include_ties=True, min_agreement=0.7)
    assert (raw.rows, raw.pairs, raw.below_agreement) == (6, 4, 3)
    kept = {r["completion_a"][0]["content"] for r in read_jsonl(tmp_path / "votes.jsonl")}
    assert kept == {"answer 0 A", "answer 1 A", "answer 4 A", "answer 6 A"}

    everything = export(tiny_project, tmp_path / "all.jsonl", min_agreement=0.0)
    assert everything.rows == 4


@pytest.mark.parametrize("include_ties", [False, True])
@pytest.mark.parametrize("fmt", ["hf", "parquet"])
def test_hf_and_parquet_hold_the_same_rows_as_jsonl(tiny_project, tmp_path, fmt, include_ties):
    build(tiny_project, PLANS)
    export(tiny_project, tmp_path / "rows.jsonl", include_ties=include_ties)
    export(tiny_project, tmp_path / "out", fmt, include_ties=include_ties)
    if fmt == "hf":
        back = datasets.load_from_disk(str(tmp_path / "out")).to_list()
    else:
        back = pq.read_table(tmp_path / "out").to_pylist()
    assert back == read_jsonl(tmp_path / "rows.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "project", "rows.jsonl"]  # no staging left behind


def test_all_null_columns_keep_their_types(tiny_project, tmp_path):
    # Imported completions have no policy version, so the policy columns hold nothing but nulls.
    build(tiny_project, [["a", "a", "b"], ["tie", "b", "b"]], policy=None)
    export(tiny_project, tmp_path / "prefs.parquet", "parquet")
    export(tiny_project, tmp_path / "prefs", "hf")
    export(tiny_project, tmp_path / "votes.parquet", "parquet", include_ties=True)
    schema = pq.read_schema(tmp_path / "prefs.parquet")
    assert schema.field("chosen_policy").type == pa.int64()
    assert schema.field("strengths").type == pa.list_(pa.string())
    assert pq.read_schema(tmp_path / "votes.parquet").field("policy_a").type == pa.int64()
    features = datasets.load_from_disk(str(tmp_path / "prefs")).features
    assert features["rejected_policy"] == datasets.Value("int64")
    rows = pq.read_table(tmp_path / "prefs.parquet").to_pylist()
    assert [(r["chosen_policy"], r["strengths"]) for r in rows] == [(None, ["much", "slight"]), (None, ["slight", None])]


def test_an_existing_out_is_refused_and_a_failed_export_leaves_nothing(tiny_project, tmp_path, monkeypatch):
    build(tiny_project, PLANS)
    (tmp_path / "taken.jsonl").write_text("keep me\n")
    with pytest.raises(ExportError, match="taken.jsonl already exists"):
        export(tiny_project, tmp_path / "taken.jsonl")
    assert (tmp_path / "taken.jsonl").read_text() == "keep me\n"
    (tmp_path / "taken").mkdir()
    with pytest.raises(ExportError, match="already exists"):
        export(tiny_project, tmp_path / "taken", "hf")

    def fail_halfway(rows, schema, path):
        path.write_text("half")
        raise OSError("disk full")

    monkeypatch.setitem(annotate.export.WRITERS, "jsonl", fail_halfway)
    with pytest.raises(ExportError, match="prefs.jsonl: disk full; nothing was written"):
        export(tiny_project, tmp_path / "new" / "prefs.jsonl")
    assert list((tmp_path / "new").iterdir()) == []


def test_cli_export_prints_counts_and_refuses_to_overwrite(tiny_project, tmp_path):
    build(tiny_project, PLANS)
    out = tmp_path / "prefs.parquet"
    result = run_tether("export", "--format", "parquet", "--out", str(out), "--project", str(tiny_project))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote 4 preference pairs to {out} (1 unresolved left out, 0 below agreement, 2 tie/both-bad left out)"
    again = run_tether("export", "--format", "parquet", "--out", str(out), "--project", str(tiny_project))
    assert again.returncode == 1
    assert f"{out} already exists" in again.stderr and "Traceback" not in again.stderr
    raw = run_tether("export", "--format", "jsonl", "--out", str(tmp_path / "v.jsonl"), "--include-ties",
                     "--min-agreement", "0.7", "--project", str(tiny_project))
    assert raw.stdout.strip() == f"wrote 6 votes on 4 pairs to {tmp_path / 'v.jsonl'}, ties and both-bad included (3 pairs below agreement left out)"
    bad = run_tether("export", "--out", str(tmp_path / "x"), "--min-agreement", "1.5", "--project", str(tiny_project))
    assert bad.returncode == 2 and "--min-agreement" in bad.stderr


def test_an_hf_export_of_50_votes_trains_a_trl_reward_model(tiny_project, tiny_model_dir, tmp_path):
    singles = [["a"], ["b"]] * 9 + [["tie"], ["both_bad"]]
    triples = [["a", "a", "b"], ["b", "tie", "b"], ["a", "b", "tie"]] + [["b", "b", "b"], ["a", "a", "a"]] * 3 + [["b", "a", "a"]]
    plans = singles + triples
    assert sum(len(plan) for plan in plans) == 50
    build(tiny_project, plans)
    result = export(tiny_project, tmp_path / "prefs", "hf")
    assert (result.rows, result.unresolved, result.tie_or_both_bad) == (27, 1, 2)

    dataset = datasets.load_from_disk(str(tmp_path / "prefs"))
    assert len(dataset) == 27
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    head_before = model.score.weight.detach().clone()
    config = RewardConfig(
        output_dir=str(tmp_path / "rm"), max_steps=1, per_device_train_batch_size=8, learning_rate=1e-3,
        report_to="none", use_cpu=True, save_strategy="no", logging_steps=1,
    )
    trainer = RewardTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    trained = trainer.train()
    assert math.isfinite(trained.training_loss)
    assert not torch.equal(model.score.weight.detach(), head_before)
