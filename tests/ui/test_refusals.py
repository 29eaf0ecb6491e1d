"""Every refusal names only options that exist: the flags of the command it refuses, or of the command it names, and
settings that tether.toml has."""

import dataclasses
import re

import click
import pytest
from click.testing import CliRunner

from tests.conftest import DEMO_PROMPTS, run_tether, toy_preferences
from ui.cli import cli
from ui.owner.config import TetherConfig

# Commands a user may try before a project has what they need; each must refuse with a way forward.
COMMANDS = [
    ("round",), ("round", "--optimizer", "ppo"), ("round", "--optimizer", "dpo"), ("round", "--optimizer", "grpo"),
    ("round", "--optimizer", "auto"), ("rm", "train"), ("rm", "score"), ("ppo",), ("judge",), ("rollback", "1"),
]


def command_of(path: list[str]) -> click.Command:
    command = cli
    for name in path:
        command = command.commands[name]
    return command


def flags_of(command: click.Command) -> set[str]:
    return {flag for param in command.params for flag in param.opts + param.secondary_opts if flag.startswith("--")} | {"--help"}


def named_options(message: str, invoked: list[str]) -> list[tuple[str, str]]:
    """Each option a refusal names, with where it must exist: ('flag', its command's path) or ('setting', '[section] key')."""
    named = []
    for quoted in re.findall(r"`tether ([^`]*)`", message):
        words = [w for w in quoted.split() if not w.startswith("-")]
        command, depth = cli, 0
        while isinstance(command, click.Group) and depth < len(words) and words[depth] in command.commands:
            command, depth = command.commands[words[depth]], depth + 1
        if isinstance(command, click.Group):  # the group alone, or a subcommand it lacks
            named.append(("command", " ".join(words[: depth + 1])))
            continue
        named.append(("command", " ".join(words[:depth])))
        named += [("flag", f"{' '.join(words[:depth])} {flag}") for flag in re.findall(r"--[a-z][a-z-]*", quoted)]
    unquoted = re.sub(r"`tether [^`]*`", "", message)
    named += [("flag", f"{' '.join(invoked)} {flag}") for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", unquoted)]
    named += [("setting", f"[{section}] {key}") for key, section in re.findall(r"(\w+) = \S+(?: or \S+)* in \[(\w+)\]", message)]
    named += [("setting", f"[{section}] {key}") for section, key in re.findall(r"\[(\w+)\] (?!of\b)(\w+)", message)]
    return named


def exists(kind: str, name: str) -> bool:
    if kind == "setting":
        section, key = re.fullmatch(r"\[(\w+)\] (\w+)", name).groups()
        sections = {f.name: f for f in dataclasses.fields(TetherConfig)}
        return section in sections and key in {f.name for f in dataclasses.fields(sections[section].default_factory())}
    if kind == "command":
        try:
            return not isinstance(command_of(name.split()), click.Group)
        except KeyError:
            return False
    *path, flag = name.split()
    return flag in flags_of(command_of(path))


def refusals(project) -> dict[tuple[str, ...], str]:
    """What each command says on this project, for those that refuse."""
    said = {}
    for command in COMMANDS:
        result = CliRunner().invoke(cli, [*command, "--project", str(project)])
        if result.exit_code:
            assert result.exception is None or isinstance(result.exception, SystemExit), (command, result.exception)
            said[command] = result.output
    return said


def test_the_checker_catches_an_option_that_is_not_there():
    """The check below, on messages like those issue 46 found: `tether round` has no --include-imported."""
    wrong = named_options("no resolved comparisons to train on yet: collect votes first, or use --include-imported", ["round"])
    assert [n for n in wrong if not exists(*n)] == [("flag", "round --include-imported")]
    right = named_options("collect votes first, or `tether rm train --include-imported`, or set include_imported = true in "
                          "[reward_model] of tether.toml; [round] kl_budget", ["round"])
    assert all(exists(*n) for n in right) and len(right) == 4
    assert not exists("setting", "[reward_model] include_imports") and not exists("command", "rm fit")


@pytest.mark.parametrize("data", ["prompts only", "imported preferences only"])
def test_every_refusal_names_only_options_that_exist(tiny_project, tmp_path, data):
    run_tether("prompts", "import", str(DEMO_PROMPTS), "--project", str(tiny_project), check=True)
    if data == "imported preferences only":
        run_tether("import-prefs", str(toy_preferences(tmp_path / "prefs.jsonl")), "--project", str(tiny_project), check=True)
    said = refusals(tiny_project)
    assert set(said) >= {("round",), ("rm", "train"), ("ppo",), ("rollback", "1")}
    for command, output in said.items():
        missing = [name for name in named_options(output, list(command)) if not exists(*name)]
        assert not missing, f"`tether {' '.join(command)}` said {output!r}, naming {missing}"
    if data == "imported preferences only":  # the way forward is the setting that reads them
        assert "set include_imported = true in [reward_model] of tether.toml to train on the 40 imported" in said[("round",)]
