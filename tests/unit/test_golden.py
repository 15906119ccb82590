"""A golden test run with OFFCPU_UPDATE_GOLDEN=1 rewrites its file and fails: it never passes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from testkit import golden
from tests.unit.formats import test_otlp_profiles as otlp
from tests.unit.formats import test_skywalking as skywalking

# Each golden test, and a stale file in its format (one that parses but differs).
GOLDEN_TESTS = [
    pytest.param(otlp, "test_golden", "stale\n", id="otlp"),
    pytest.param(skywalking, "test_golden_messages", '{"messages": {}}\n', id="skywalking"),
]


def _on_a_copy(
    module: ModuleType, name: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[], None], Path]:
    """The golden test `name` of `module`, reading and writing a copy holding `text`."""
    copy = tmp_path / "golden" / module.GOLDEN.name
    copy.parent.mkdir()
    copy.write_text(text)
    monkeypatch.setattr(module, "GOLDEN", copy)
    return getattr(module, name), copy


@pytest.mark.parametrize(("module", "name", "stale"), GOLDEN_TESTS)
def test_the_switch_rewrites_the_file_and_fails(
    module: ModuleType, name: str, stale: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = module.GOLDEN.read_text()
    test, copy = _on_a_copy(module, name, stale, tmp_path, monkeypatch)
    monkeypatch.setenv(golden.SWITCH, "1")
    with pytest.raises(pytest.fail.Exception, match="golden file rewritten: review the diff and run again without"):
        test()
    assert copy.read_text() == committed


@pytest.mark.parametrize(("module", "name", "stale"), GOLDEN_TESTS)
def test_without_the_switch_the_file_is_only_compared(
    module: ModuleType, name: str, stale: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = module.GOLDEN.read_text()
    monkeypatch.delenv(golden.SWITCH, raising=False)
    test, copy = _on_a_copy(module, name, stale, tmp_path, monkeypatch)
    with pytest.raises(AssertionError):
        test()
    assert copy.read_text() == stale
    copy.write_text(committed)
    test()
