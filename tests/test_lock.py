"""scripts/requirements.lock: the exact versions the suite passed with, within pyproject.toml's ranges, and the ones
this environment runs (scripts/setup.sh installs them)."""

import re
import tomllib
from importlib.metadata import version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins(path) -> dict[str, Version]:
    """A requirements file's name==version lines, by canonical name."""
    found = {}
    for line in path.read_text().splitlines():
        if match := PIN.match(line.split("#")[0].strip()):
            found[canonicalize_name(match[1])] = Version(match[2])
    return found


def required() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]


def out_of_range(requirements: list[Requirement], locked: dict[str, Version]) -> list[str]:
    """Each requirement the pins leave unmet, in words: missing, or outside its range."""
    wrong = []
    for requirement in requirements:
        pinned = locked.get(canonicalize_name(requirement.name))
        if pinned is None:
            wrong.append(f"{requirement.name} is not locked")
        elif not requirement.specifier.contains(pinned, prereleases=True):
            wrong.append(f"{requirement.name}=={pinned} is outside {requirement}")
    return wrong


def test_the_lock_pins_every_requirement_within_pyproject_ranges_and_torch_at_its_own_pin():
    locked = pins(REPO / "scripts/requirements.lock") | pins(REPO / "scripts/torch.txt")
    assert len(locked) > 50 and "torch" in locked
    assert out_of_range(required(), locked) == []
    assert "torch" not in pins(REPO / "scripts/requirements.lock")  # scripts/torch.txt says why


def test_a_lock_outside_a_range_or_missing_a_requirement_is_found():
    requirements = [Requirement("gradio>=5.0"), Requirement("duckdb>=1.2")]
    assert out_of_range(requirements, {"gradio": Version("4.44.1")}) == [
        "gradio==4.44.1 is outside gradio>=5.0", "duckdb is not locked"]


def test_this_environment_runs_the_locked_versions():
    locked = pins(REPO / "scripts/requirements.lock")
    installed = {name: Version(version(name)) for name in locked}
    assert {name: str(v) for name, v in installed.items() if v != locked[name]} == {}
    torch = Version(version("torch"))
    assert Version(torch.base_version) == pins(REPO / "scripts/torch.txt")["torch"]  # the CPU build is 2.13.0+cpu
