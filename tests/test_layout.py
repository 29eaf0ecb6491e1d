"""The packages import each other in one direction only: ui/web and ui/cli -> ui/owner -> annotate, train, store;
annotate -> store and train's modules without torch. No module imports itself through others, at the top or inside
a function. Only store/ touches DuckDB, and the owner knows nothing of Gradio or click."""

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

# Where each part of the code may import from, of the project's own packages.
MAY_IMPORT = {
    "store": {"store"},
    "train": {"train"},
    # train's modules without torch (train.common.snapshot, train.common.files): the export writes the preference
    # snapshot's shape and puts files in place as the worker does; tests/test_files.py checks they stay light.
    "annotate": {"annotate", "store", "train"},
    "ui.owner": {"ui.owner", "annotate", "train", "store"},
    "ui.web": {"ui.web", "ui.owner", "annotate", "train", "store"},
    "ui.cli": {"ui.owner", "annotate", "train", "store", "ui.web"},
}
OURS = ("store", "train", "annotate", "ui")

# train's parts, lowest first: each imports from those before it and itself, never from one after it.
TRAIN_LAYERS = ("train.common", "train.runtime", "train.reward", "train.policy", "train.worker")


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


def test_train_imports_nothing_from_a_layer_above():
    """A module of one of TRAIN_LAYERS imports nothing of a later one, at the top or inside a function."""
    subpackages = {f"train.{p.parent.name}" for p in (REPO / "train").glob("*/__init__.py")}
    assert subpackages <= set(TRAIN_LAYERS), f"add {sorted(subpackages - set(TRAIN_LAYERS))} to TRAIN_LAYERS"
    upward = []
    for rank, layer in enumerate(TRAIN_LAYERS):
        for path in sources(layer):
            names = imports(path)
            modules = {name for name in names if name.rpartition(".")[0] not in names}  # not each name taken from one
            upward += [f"{path.relative_to(REPO)} ({layer}) imports {name}" for name in sorted(modules)
                       if any(name == above or name.startswith(above + ".") for above in TRAIN_LAYERS[rank + 1:])]
    assert not upward, "\n".join(upward)


def test_only_store_imports_duckdb_and_the_owner_no_interface():
    code = [p for p in REPO.glob("*/**/*.py") if p.parts[len(REPO.parts)] in ("store", "train", "annotate", "ui")]
    assert len(code) > 40
    duckdb = {str(p.relative_to(REPO)) for p in code if any(n.split(".")[0] == "duckdb" for n in imports(p))}
    assert duckdb and all(p.startswith("store/") for p in duckdb), duckdb
    interface = {str(p.relative_to(REPO)) for p in sources("ui.owner") if any(n.split(".")[0] in ("gradio", "click") for n in imports(p))}
    assert not interface, interface


def module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each of the project's modules, and the project's modules it imports (a name imported from a package counts as
    its module where it is one)."""
    modules = {module_of(path): path for part in OURS for path in (REPO / part).rglob("*.py")}
    return {name: {m for m in imports(path) if m in modules and m != name} for name, path in modules.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A chain of imports that comes back to where it began, or None: a depth-first walk that meets a module on its
    own path."""
    done: set[str] = set()

    def walk(path: list[str]) -> list[str] | None:
        for name in sorted(graph[path[-1]]):
            if name in path:
                return path[path.index(name):] + [name]
            if name not in done and (circle := walk(path + [name])):
                return circle
        done.add(path[-1])
        return None

    return next((circle for root in sorted(graph) if root not in done and (circle := walk([root]))), None)


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    assert len(graph) > 60 and sum(map(len, graph.values())) > 150
    assert find_circle(graph) is None, " -> ".join(find_circle(graph))


def test_the_circle_finder_finds_one_through_an_import_inside_a_function(tmp_path):
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def load():\n    from train.reward.lora import load_lora\n")
    assert "train.reward.lora" in imports(lazy)


def test_neither_kind_of_reward_model_imports_the_other():
    """The two kinds meet only in train.reward.versions, which callers use to load either."""
    graph = import_graph()
    assert "train.reward.head" not in graph["train.reward.lora"] and "train.reward.lora" not in graph["train.reward.head"]
    reaching = {name for name, targets in graph.items() if {"train.reward.lora", "train.reward.head"} <= targets}
    assert reaching == {"train.reward.versions"}, reaching
