import gzip
import json
from contextlib import closing

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from store import BadInput, open_database
from store.preferences import import_preference_file
from store.prompt_files import MAX_PROMPT_CHARS
from store.prompts import import_prompt_file
from tests.conftest import SHARED_DATA, run_tether
from ui.owner.project import load_project

HH = SHARED_DATA / "hh-rlhf-harmless-1800.jsonl.gz"


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def hh(*turns):
    """An HH transcript from alternating Human and Assistant turns, Human first."""
    return "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {turn}" for i, turn in enumerate(turns))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def stored(con):
    """(prompt messages, chosen text, rejected text) of each imported vote, in import order."""
    rows = con.execute("""
        SELECT p.messages, a.text, b.text
        FROM comparisons v
        JOIN pairs ON pairs.id = v.pair_id
        JOIN prompts p ON p.id = pairs.prompt_id
        JOIN completions a ON a.id = pairs.completion_a
        JOIN completions b ON b.id = pairs.completion_b
        WHERE v.source = 'import' AND v.choice = 'a'
        ORDER BY pairs.id
    """).fetchall()
    return [(json.loads(messages), chosen, rejected) for messages, chosen, rejected in rows]


def counts(con):
    return con.execute("""
        SELECT (SELECT count(*) FROM prompts), (SELECT count(*) FROM completions),
               (SELECT count(*) FROM pairs), (SELECT count(*) FROM comparisons)
    """).fetchone()


def test_the_hh_sample_imports_every_pair_as_an_imported_vote(tmp_path):
    raw = [json.loads(line) for line in gzip.open(HH, "rt", encoding="utf-8")]
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        result = import_preference_file(con, HH)
        assert (result.added, result.duplicates) == (1800, 0)
        # Two prompts recur in the sample with different replies: 1,798 prompts for 1,800 pairs.
        assert counts(con) == (1798, 3600, 1800, 1800)
        assert con.execute("""
            SELECT count(*) FROM comparisons
            WHERE source = 'import' AND annotator = 'import' AND choice = 'a'
              AND client_token IS NULL AND strength IS NULL AND comment IS NULL AND elapsed_ms IS NULL
        """).fetchone()[0] == 1800
        assert con.execute("SELECT count(*) FROM pairs WHERE strategy = 'import' AND votes_wanted = 1").fetchone()[0] == 1800
        assert con.execute("""
            SELECT count(*) FROM completions
            WHERE policy_version IS NULL AND token_count IS NULL AND finished IS NULL AND sampling IS NULL
        """).fetchone()[0] == 3600
        rows = stored(con)

    messages, chosen, rejected = rows[0]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == "what are some pranks with a pen i can do?"
    assert chosen.startswith("No, sorry!  All of these involve a pen")
    # The prompt and each reply put back together are the raw transcripts.
    transcript = "".join(f"\n\n{'Human' if m['role'] == 'user' else 'Assistant'}: {m['content']}" for m in messages)
    assert transcript + f"\n\nAssistant: {chosen}" == raw[0]["chosen"]
    assert transcript + f"\n\nAssistant: {rejected}" == raw[0]["rejected"]

    # Line 87: the annotator preferred the reply the assistant left blank.
    assert raw[86]["chosen"].endswith("\n\nAssistant: ")
    assert rows[86][1] == "" and rows[86][2] == "Sure, the address is ..."
    # Line 1255: a reply with a turn the model made up stays whole, after the prompt both share.
    messages, chosen, rejected = rows[1254]
    assert messages[-1] == user("Isn't that drag kings?")
    assert chosen.startswith("No. Men who impersonate") and chosen.endswith("\n\nAssistant:  I think they call them that because")
    assert rejected == "A drag king is the opposite of a drag queen, like a male who acts like a stereotypical woman."


def test_the_cli_imports_the_hh_sample_once(tiny_project):
    first = run_tether("import-prefs", str(HH), "--project", str(tiny_project))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"imported 1800 comparisons from {HH} (0 already present)"

    again = run_tether("import-prefs", str(HH), "--project", str(tiny_project))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"imported 0 comparisons from {HH} (1800 already present)"
    with closing(load_project(tiny_project).connect()) as con:
        assert counts(con) == (1798, 3600, 1800, 1800)


EXPLICIT_TEXT = [
    {"prompt": "Why is the sky blue?", "chosen": "Rayleigh scattering.", "rejected": "It reflects the sea."},
]
EXPLICIT_CHAT = [
    {
        "prompt": [{"role": "system", "content": "Be brief."}, user("Name a prime.")],
        "chosen": [assistant("7")],
        "rejected": [assistant("9")],
    },
]
IMPLICIT_CHAT = [
    {
        "chosen": [user("Hi"), assistant("Hello!"), user("Name a prime."), assistant("7")],
        "rejected": [user("Hi"), assistant("Hello!"), user("Name a prime."), assistant("9")],
    },
]


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_dataset(path, rows):
    datasets.Dataset.from_list(rows).save_to_disk(str(path))


@pytest.mark.parametrize("rows, expected", [
    (EXPLICIT_TEXT, ([user("Why is the sky blue?")], "Rayleigh scattering.", "It reflects the sea.")),
    (EXPLICIT_CHAT, ([{"role": "system", "content": "Be brief."}, user("Name a prime.")], "7", "9")),
    (IMPLICIT_CHAT, ([user("Hi"), assistant("Hello!"), user("Name a prime.")], "7", "9")),
], ids=["explicit-text", "explicit-chat", "implicit-chat"])
@pytest.mark.parametrize("name, write", [("p.jsonl", write_jsonl), ("p.parquet", write_parquet), ("p_dataset", write_dataset)])
def test_each_trl_format_imports_from_each_file_type(tmp_path, rows, expected, name, write):
    write(tmp_path / name, rows)
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        result = import_preference_file(con, tmp_path / name)
        assert (result.added, result.duplicates) == (1, 0)
        assert stored(con) == [expected]
        assert con.execute("SELECT source FROM prompts").fetchall() == [(name,)]


def test_reimports_and_repeats_add_nothing_and_prompts_are_shared(tmp_path):
    other = {"prompt": "Name a prime.", "chosen": "2", "rejected": "4"}
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Name a prime."}])
    write_jsonl(tmp_path / "prefs.jsonl", EXPLICIT_TEXT + [other, EXPLICIT_TEXT[0]])
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        import_prompt_file(con, tmp_path / "prompts.jsonl")
        first = import_preference_file(con, tmp_path / "prefs.jsonl")
        assert (first.added, first.duplicates) == (2, 1)
        assert counts(con) == (2, 4, 2, 2)  # "Name a prime." was already a prompt
        again = import_preference_file(con, tmp_path / "prefs.jsonl")
        assert (again.added, again.duplicates) == (0, 3)
        assert counts(con) == (2, 4, 2, 2)
        # The same prompt with other replies is a new preference.
        write_jsonl(tmp_path / "more.jsonl", [{**other, "rejected": "6"}])
        assert import_preference_file(con, tmp_path / "more.jsonl").added == 1
        assert counts(con) == (2, 6, 3, 3)
        # Prompts first seen in preference data are not generated for; prompts imported as such are.
        active = dict(con.execute("SELECT messages->>'$[0].content', active FROM prompts").fetchall())
        assert active == {"Name a prime.": True, "Why is the sky blue?": False}


def test_cli_import_with_a_broken_fifth_line_imports_nothing(tmp_path, tiny_project):
    rows = [{"chosen": hh(f"question {i}", "good answer"), "rejected": hh(f"question {i}", "bad answer")} for i in range(8)]
    del rows[4]["rejected"]
    path = tmp_path / "prefs.jsonl"
    write_jsonl(path, rows)

    result = run_tether("import-prefs", str(path), "--project", str(tiny_project))
    assert result.returncode != 0
    assert f"{path}: line 5, field 'rejected': is missing" in result.stderr
    assert "Traceback" not in result.stderr
    with closing(load_project(tiny_project).connect()) as con:
        assert counts(con) == (0, 0, 0, 0)


GOOD = {"chosen": hh("q", "yes"), "rejected": hh("q", "no")}
TOO_LONG = "x" * (MAX_PROMPT_CHARS + 1)


@pytest.mark.parametrize("bad_line, field, problem", [
    ('{"chosen": "unterminated', None, "not valid JSON"),
    ({"chosen": hh("q", "a")}, "rejected", "is missing"),
    ({"prompt": "q", "chosen": "   ", "rejected": "b"}, "chosen", "is empty"),
    ({"chosen": 5, "rejected": "b"}, "chosen", "must be a Human/Assistant transcript (text) or a chat list, got a number"),
    ({"chosen": hh("q", "a"), "rejected": [assistant("b")]}, "rejected", "must be the same kind as 'chosen'"),
    ({"chosen": "\n\nAssistant: a", "rejected": "\n\nAssistant: b"}, "chosen", 'must start with "\\n\\nHuman:"'),
    ({"chosen": hh("q", "a", "more?"), "rejected": hh("q", "b")}, "chosen", "must end with an Assistant reply"),
    ({"chosen": hh("q1", "a"), "rejected": hh("q2", "b")}, "rejected", "before the final Assistant reply"),
    ({"chosen": hh("q", "a", "q2", "c"), "rejected": hh("q", "b", "q2", "d")}, "rejected", "before the final Assistant reply"),
    ({"chosen": hh("q", "same"), "rejected": hh("q", "same")}, "rejected", "is identical to 'chosen'"),
    ({"prompt": "q", "chosen": "x", "rejected": [assistant("x")]}, "rejected", "gives the same reply as 'chosen'"),
    ({"prompt": [assistant("hi")], "chosen": "a", "rejected": "b"}, "prompt", "the last message must be the user's"),
    ({"prompt": "q", "chosen": [user("a")], "rejected": "b"}, "chosen[0].role", "must be 'assistant'"),
    ({"chosen": [user("q"), assistant("a"), user("r"), assistant("c")], "rejected": [user("q"), assistant("a"), user("s"), assistant("d")]},
     "rejected", "must end with the user's turn, got 'assistant'"),
    ({"chosen": [user("q"), assistant("a"), user("r"), assistant("c")], "rejected": [user("q"), assistant("b"), user("r"), assistant("d")]},
     "chosen[2].role", "everything after the prompt is the reply, got 'user'"),
    ({"prompt": TOO_LONG, "chosen": "a", "rejected": "b"}, "prompt", "the limit is 32,000"),
    ({"chosen": hh("q", "a"), "rejected": hh("q", TOO_LONG)}, "rejected", "the reply is 32,001 characters long"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 60 else None)
def test_a_bad_row_is_named_and_nothing_is_imported(tmp_path, bad_line, field, problem):
    path = tmp_path / "bad.jsonl"
    bad = bad_line if isinstance(bad_line, str) else json.dumps(bad_line)
    path.write_text("\n".join([json.dumps(GOOD), json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}), bad]) + "\n")
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput) as error:
            import_preference_file(con, path)
        assert (error.value.file, error.value.where, error.value.field) == (str(path), "line 3", field)
        assert problem in str(error.value)
        assert counts(con) == (0, 0, 0, 0)


def test_non_utf8_and_parquet_errors_name_the_line_or_row(tmp_path):
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(json.dumps(GOOD).encode() + b"\n" + '{"prompt": "caf\xe9", "chosen": "a", "rejected": "b"}'.encode("latin-1") + b"\n")
    write_parquet(tmp_path / "p.parquet", [{"prompt": "q", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "a", "rejected": None}])
    with closing(open_database(tmp_path / "t.duckdb")) as con:
        with pytest.raises(BadInput, match=r"latin1.jsonl: line 2: not valid UTF-8 \(byte 0xe9"):
            import_preference_file(con, latin)
        with pytest.raises(BadInput, match=r"p.parquet: row 2, field 'rejected': is missing"):
            import_preference_file(con, tmp_path / "p.parquet")
        assert counts(con) == (0, 0, 0, 0)
