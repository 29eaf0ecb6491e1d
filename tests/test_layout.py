"""The packages import each other in one direction only: ui/web and ui/cli -> ui/owner -> annotate, train, store;
annotate -> store and train's modules without torch. Only store/ touches DuckDB, and the owner knows nothing of Gradio or click."""

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

# Where each part of the code may import from, of the project's own packages.
MAY_IMPORT = {
    "store": {"store"},
    "train": {"train"},
    # train's modules without torch (train.snapshot, train.files): the export writes the preference
    # snapshot's shape and puts files in place as the worker does; tests/test_files.py checks they stay light.
    "annotate": {"annotate", "store", "train"},
    "ui.owner": {"ui.owner", "annotate", "train", "store"},
    "ui.web": {"ui.web", "ui.owner", "annotate", "train", "store"},
    "ui.cli": {"ui.owner", "annotate", "train", "store", "ui.web"},
}
OURS = ("store", "train", "annotate", "ui")


def imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def part_of(module: str) -> str | None:
    """The part of the layout (a key of MAY_IMPORT) a dotted module name belongs to."""
    for part in sorted(MAY_IMPORT, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    return None


def sources(part: str) -> list[Path]:
    path = REPO / part.replace(".", "/")
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


@pytest.mark.parametrize("part", list(MAY_IMPORT))
def test_each_part_imports_only_what_it_may(part):
    wrong = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources(part)
        for name in imports(path)
        if name.split(".")[0] in OURS and (target := part_of(name)) is not None and target not in MAY_IMPORT[part]
    }
    assert not wrong, sorted(wrong)


def test_only_store_imports_duckdb_and_the_owner_no_interface():
    code = [p for p in REPO.glob("*/**/*.py") if p.parts[len(REPO.parts)] in ("store", "train", "annotate", "ui")]
    assert len(code) > 40
    duckdb = {str(p.relative_to(REPO)) for p in code if any(n.split(".")[0] == "duckdb" for n in imports(p))}
    assert duckdb and all(p.startswith("store/") for p in duckdb), duckdb
    interface = {str(p.relative_to(REPO)) for p in sources("ui.owner") if any(n.split(".")[0] in ("gradio", "click") for n in imports(p))}
    assert not interface, interface
