"""constraints.txt, the exact versions the Dockerfile and scripts/setup install: it pins the whole runtime
closure of offcpu-exporter, every pin is inside pyproject.toml's range, and it is what the test
venv runs (so the image runs what the tests ran)."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+!-]+)", line)
            assert m, f"not an exact pin: {line!r}"
            name = canonicalize_name(m[1])
            assert name not in found, f"pinned twice: {name}"
            found[name] = m[2]
    return found


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def closure(requirements: list[Requirement]) -> dict[str, str]:
    """Installed name -> version of `requirements` and everything they require, as installed here."""
    seen: dict[str, str] = {}
    visited: set[tuple[str, tuple[str, ...]]] = set()
    # (requirement, the extras of the distribution that asked for it: its markers may name them)
    todo: list[tuple[Requirement, tuple[str, ...]]] = [(r, ()) for r in requirements]
    while todo:
        req, parent_extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in parent_extras or ("",)):
            continue
        dist = md.distribution(req.name)
        name = canonicalize_name(dist.metadata["Name"])
        extras = tuple(sorted(req.extras))
        if (name, extras) in visited:
            continue
        visited.add((name, extras))
        seen[name] = dist.version
        todo.extend((Requirement(r), extras) for r in dist.requires or [])
    return seen


def test_every_pin_is_inside_the_declared_range() -> None:
    pinned = pins()
    for req in runtime_requirements():
        name = canonicalize_name(req.name)
        assert name in pinned, f"{name} is a runtime dependency without a pin"
        assert req.specifier.contains(pinned[name], prereleases=True), (name, pinned[name], str(req.specifier))


def test_pins_are_the_runtime_closure_as_tested() -> None:
    installed = closure(runtime_requirements())
    pinned = pins()
    assert set(pinned) == set(installed), (
        f"missing pins: {sorted(set(installed) - set(pinned))}, pins of no runtime dependency: "
        f"{sorted(set(pinned) - set(installed))}")
    differ = {n: (pinned[n], installed[n]) for n in pinned if pinned[n] != installed[n]}
    assert not differ, f"constraints.txt and the tested venv disagree (pin, installed): {differ}; rerun scripts/setup"


def test_opentelemetry_proto_is_capped_at_the_tested_minor() -> None:
    # OTLP profiles are v1development: the next minor may change them, so the range stops before it.
    req = next(r for r in runtime_requirements() if r.name == "opentelemetry-proto")
    major, minor = (int(x) for x in pins()["opentelemetry-proto"].split(".")[:2])
    assert req.specifier.contains(f"{major}.{minor}.99")
    assert not req.specifier.contains(f"{major}.{minor + 1}.0")
