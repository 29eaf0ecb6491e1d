import csv
import gzip
import json
from contextlib import closing

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from store import BadInput, open_database
from store.input_files import ImportLimits
from store.prompt_files import MAX_PROMPT_CHARS
from store.prompts import import_prompt_file
from tests.conftest import run_tether

ROWS = [
    {"prompt": "Why is the sea salty?", "tags": ["science"]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]},
    {"prompt": "Écris un haïku sur la pluie. 雨"},
]
EXPECTED = [
    ([{"role": "user", "content": "Why is the sea salty?"}], ["science"]),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}], []),
    ([{"role": "user", "content": "Écris un haïku sur la pluie. 雨"}], []),
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_csv(path, rows):
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["prompt", "messages", "tags"])
        writer.writeheader()
        for r in rows:
            writer.writerow({
                "prompt": r.get("prompt", ""),
                "messages": json.dumps(r["messages"]) if "messages" in r else "",
                "tags": ",".join(r.get("tags", [])),
            })


def columnar(rows):
    """Rows with every column, null where a row has no value: how Parquet and datasets store them."""
    keys = {key for row in rows for key in row}
    return [{key: row.get(key) for key in sorted(keys)} for row in rows]


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(columnar(rows)), path)


def write_dataset(path, rows):
    datasets.Dataset.from_list(columnar(rows)).save_to_disk(str(path))


def write_jsonl_gz(path, rows):
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))


def stored(con):
    return [
        (json.loads(messages), tags)
        for messages, tags in con.execute("SELECT messages, tags FROM prompts ORDER BY id").fetchall()
    ]


@pytest.mark.parametrize("name, write", [
    ("p.jsonl", write_jsonl), ("p.jsonl.gz", write_jsonl_gz), ("p.csv", write_csv),
    ("p.parquet", write_parquet), ("p_dataset", write_dataset),
])
def test_each_format_imports_prompts_and_chats(tmp_path, name, write):
    write(tmp_path / name, ROWS)
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        result = import_prompt_file(con, tmp_path / name)
        assert (result.added, result.duplicates) == (3, 0)
        assert stored(con) == EXPECTED
        assert {row[0] for row in con.execute("SELECT source FROM prompts").fetchall()} == {name}


def test_imports_are_deduplicated_by_content(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ROWS + [ROWS[0]])
    write_jsonl(tmp_path / "b.jsonl", [{"prompt": "Why is the sea salty?", "tags": ["other"]}, {"prompt": "New one?"}])
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        first = import_prompt_file(con, tmp_path / "a.jsonl")
        second = import_prompt_file(con, tmp_path / "b.jsonl")
        assert (first.added, first.duplicates) == (3, 1)
        assert (second.added, second.duplicates) == (1, 1)
        assert con.execute("SELECT count(*) FROM prompts").fetchone()[0] == 4


GOOD = json.dumps({"prompt": "fine"})


@pytest.mark.parametrize("bad_line, where, field, problem", [
    ('{"prompt": "unterminated', "line 3", None, "not valid JSON"),
    ('["a", "list"]', "line 3", None, "expected a JSON object, got a list"),
    ('{"text": "no prompt key"}', "line 3", "prompt", "is missing"),
    ('{"prompt": "   "}', "line 3", "prompt", "is empty"),
    ('{"prompt": 42}', "line 3", "prompt", "must be text, got a number"),
    ('{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}', "line 3", "prompt", "not both"),
    ('{"messages": "not a list"}', "line 3", "messages", "not a valid JSON chat list"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "line 3", "messages[0].role", "must be one of"),
    ('{"messages": [{"role": "user", "content": ""}]}', "line 3", "messages[0].content", "is empty"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}', "line 3", "messages", "last message must be the user's"),
    ('{"prompt": "ok", "tags": [1, 2]}', "line 3", "tags", "list of text tags"),
    (json.dumps({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}), "line 3", "prompt", "the limit is"),
])
def test_a_bad_jsonl_row_is_named_and_nothing_is_imported(tmp_path, bad_line, where, field, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([GOOD, json.dumps({"prompt": "also fine"}), bad_line, GOOD]) + "\n")
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput) as error:
            import_prompt_file(con, path)
        assert (error.value.file, error.value.where, error.value.field) == (str(path), where, field)
        assert problem in str(error.value)
        assert str(error.value).startswith(f"{path}: {where}")
        assert con.execute("SELECT count(*) FROM prompts").fetchone()[0] == 0


def test_non_utf8_is_named_by_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + '{"prompt": "caf\xe9"}'.encode("latin-1") + b"\n")
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match=r"line 2: not valid UTF-8 \(byte 0xe9"):
            import_prompt_file(con, path)


def test_csv_errors_name_the_line_and_field(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt,tags\nfine,\n,oops\n")
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match=r"p.csv: line 3, field 'prompt': is empty"):
            import_prompt_file(con, path)
    (tmp_path / "latin.csv").write_bytes(b"prompt\nfine\ncaf\xe9\n")
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match=r"latin.csv: line 3: not valid UTF-8"):
            import_prompt_file(con, tmp_path / "latin.csv")


def test_parquet_and_dataset_errors_name_the_row(tmp_path):
    rows = [{"prompt": "fine"}, {"prompt": "fine too"}, {"prompt": None}]
    write_parquet(tmp_path / "p.parquet", rows)
    write_dataset(tmp_path / "d", rows)
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match=r"p.parquet: row 3, field 'prompt': is empty"):
            import_prompt_file(con, tmp_path / "p.parquet")
        with pytest.raises(BadInput, match=r"d: row 3, field 'prompt': is empty"):
            import_prompt_file(con, tmp_path / "d")


def test_a_dataset_with_splits_asks_for_one(tmp_path):
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:1]), "test": datasets.Dataset.from_list(ROWS[2:])}).save_to_disk(str(tmp_path / "dd"))
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match="holds the splits train, test"):
            import_prompt_file(con, tmp_path / "dd")
        assert import_prompt_file(con, tmp_path / "dd" / "train").added == 1


def test_unknown_formats_and_missing_files_are_refused(tmp_path):
    (tmp_path / "p.txt").write_text("hello\n")
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match="unknown format"):
            import_prompt_file(con, tmp_path / "p.txt")
        with pytest.raises(BadInput, match="does not exist"):
            import_prompt_file(con, tmp_path / "nope.jsonl")


def test_a_failed_import_keeps_earlier_prompts_as_they_were(tmp_path):
    write_jsonl(tmp_path / "good.jsonl", ROWS)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "new"}) + "\n" + '{"prompt": 1}\n')
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        import_prompt_file(con, tmp_path / "good.jsonl")
        with pytest.raises(BadInput):
            import_prompt_file(con, tmp_path / "bad.jsonl")
        assert stored(con) == EXPECTED


def test_cli_import_with_a_malformed_seventh_line_imports_nothing(tmp_path, tiny_project):
    lines = [json.dumps({"prompt": f"question {i}"}) for i in range(10)]
    lines[6] = '{"prompt": "seventh", oops}'
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")

    result = run_tether("prompts", "import", str(path), "--project", str(tiny_project))
    assert result.returncode != 0
    assert f"{path}: line 7: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr

    status = run_tether("status", "--project", str(tiny_project))
    assert status.returncode == 0, status.stderr
    assert "prompts       0 (0 active)" in status.stdout


@pytest.mark.parametrize("name, write", [
    ("p.jsonl", write_jsonl), ("p.jsonl.gz", write_jsonl_gz), ("p.csv", write_csv),
    ("p.parquet", write_parquet), ("p_dataset", write_dataset),
])
def test_each_format_is_refused_past_the_row_and_size_limits(tmp_path, name, write):
    # Repeated text compresses well, so the .gz and Parquet files are far smaller than what they hold.
    rows = [{"prompt": f"{i} " + "many words " * 1_000} for i in range(120)]
    write(tmp_path / name, rows)
    when = {"p.jsonl.gz": " when decompressed", "p.parquet": " uncompressed"}.get(name, "")
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match=rf"{name}: file: has more than 100 rows, the limit set by \[server\] max_import_rows"):
            import_prompt_file(con, tmp_path / name, ImportLimits(max_rows=100))
        with pytest.raises(BadInput, match=rf"{name}: file: is larger than 1 MiB{when}, the limit set by \[server\] max_import_mb"):
            import_prompt_file(con, tmp_path / name, ImportLimits(max_mb=1))
        assert con.execute("SELECT count(*) FROM prompts").fetchone()[0] == 0
        assert import_prompt_file(con, tmp_path / name, ImportLimits(max_mb=2, max_rows=120)).added == 120


def test_a_corrupt_gzip_file_is_named(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"prompt": "fine"}\n' * 100)[:-20])
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match=r"p.jsonl.gz: file: not a readable gzip file"):
            import_prompt_file(con, path)
