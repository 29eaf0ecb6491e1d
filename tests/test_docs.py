"""Every command and setting is documented where it lives, and the docs name only what exists.

Commands document themselves in `--help`, settings in their dataclass fields (`tether settings`
prints them), benchmarks in scripts/BENCHMARKS.md. The README is a short front door: it must
stay short, name the two commands a newcomer runs, and name no command that does not exist.
"""

import re

import click
import pytest
from click.testing import CliRunner

from tests.conftest import REPO
from ui.cli import cli
from ui.owner.config import SECTIONS, all_settings

README = REPO / "README.md"
BENCHMARKS = REPO / "scripts" / "BENCHMARKS.md"


def commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield prefix + (name,), command
        if isinstance(command, click.Group):
            yield from commands(command, prefix + (name,))


@pytest.mark.parametrize("path, command", list(commands(cli)), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_command_has_help_with_an_example(path, command):
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert command.help and len(command.help.strip()) > 20
    if not isinstance(command, click.Group):
        assert "Example:" in command.help
        examples = command.help.split("Example:", 1)[1]
        assert f"tether {' '.join(path)}" in examples, "the example runs the command it documents"


def test_every_setting_has_help():
    settings = all_settings()
    assert {s.section for s in settings} == set(SECTIONS)
    missing = [f"[{s.section}] {s.name}" for s in settings if len(s.help.strip()) < 10]
    assert not missing, f"settings without help: {missing}"


def test_tether_settings_prints_every_setting():
    result = CliRunner().invoke(cli, ["settings"])
    assert result.exit_code == 0, result.output
    for section in SECTIONS:
        assert f"[{section}]" in result.output
    for setting in all_settings():
        assert f"\n{setting.name} = " in result.output
        assert " ".join(setting.help.split()[:4]) in " ".join(result.output.split())

    one = CliRunner().invoke(cli, ["settings", "--section", "ppo"])
    assert one.exit_code == 0 and "[ppo]" in one.output and "[dpo]" not in one.output


def test_every_benchmark_script_is_described_in_benchmarks_md():
    text = BENCHMARKS.read_text(encoding="utf-8")
    scripts = [*sorted((REPO / "scripts").glob("bench_*.py")), REPO / "scripts" / "soak.py", REPO / "scripts" / "fuzz.py",
               REPO / "scripts" / "crash.py"]
    missing = [s.name for s in scripts if f"scripts/{s.name}" not in text]
    assert not missing, f"not in scripts/BENCHMARKS.md: {missing}"


def test_the_readme_is_a_short_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert "scripts/demo.sh" in text and "scripts/test.sh" in text
    assert "scripts/BENCHMARKS.md" in text and "tether settings" in text


def command_lines(text: str) -> list[list[str]]:
    """The words after `tether` wherever the docs show a command: in code blocks and `code` spans."""
    code = re.findall(r"```.*?```", text, flags=re.S) + re.findall(r"`[^`\n]+`", re.sub(r"```.*?```", "", text, flags=re.S))
    found = []
    for span in code:
        for match in re.finditer(r"(?:^|[\s/(`])tether((?: [a-z][a-z-]*)+)", span, flags=re.M):
            found.append(match.group(1).split())
    return found


def named_command(words: list[str]) -> str | None:
    """Why these words do not start a real command, or None when they do."""
    group: click.Command = cli
    for i, word in enumerate(words):
        if not isinstance(group, click.Group):
            return None  # the rest are the command's arguments
        if word not in group.commands:
            return f"tether {' '.join(words[:i + 1])}: no such command"
        group = group.commands[word]
    return None


@pytest.mark.parametrize("doc", [README, BENCHMARKS], ids=lambda p: p.name)
def test_the_docs_name_only_real_commands(doc):
    lines = command_lines(doc.read_text(encoding="utf-8"))
    assert lines, f"{doc.name} shows no tether command"
    wrong = [why for words in lines if (why := named_command(words))]
    assert not wrong, f"{doc.name}: {wrong}"


def test_a_command_that_does_not_exist_is_caught():
    assert named_command(["frobnicate"]) == "tether frobnicate: no such command"
    assert named_command(["users", "add", "alice"]) is None
    assert named_command(["users", "remove", "alice"]) == "tether users remove: no such command"
    assert command_lines("run `tether rm train` then\n```bash\n.venv/bin/tether export --out x\n```\nthe KL tether to v0") == [
        ["export"], ["rm", "train"]]
