"""The golden-file switch (testkit/golden.py), which every golden test calls before it compares
(tests/unit/formats/test_otlp_profiles.py::test_golden, test_skywalking.py::test_golden_messages):
a run with OFFCPU_UPDATE_GOLDEN=1 rewrites the file and fails, it never passes; without the switch
the file is only read."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit import golden

PRODUCED = "what the code produces now\n"


def _golden_test(path: Path) -> None:
    """A golden test as the format tests write them."""
    golden.rewrite_if_requested(path, PRODUCED)
    assert path.read_text() == PRODUCED


def test_the_switch_rewrites_the_file_and_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "golden" / "file.txt"
    path.parent.mkdir()
    path.write_text("stale\n")
    monkeypatch.setenv(golden.SWITCH, "1")
    with pytest.raises(pytest.fail.Exception, match="golden file rewritten: review the diff and run again without"):
        _golden_test(path)
    assert path.read_text() == PRODUCED
    # also when the file is already right: a run with the switch never passes
    with pytest.raises(pytest.fail.Exception):
        _golden_test(path)


def test_without_the_switch_the_file_is_only_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "file.txt"
    path.write_text("stale\n")
    monkeypatch.delenv(golden.SWITCH, raising=False)
    with pytest.raises(AssertionError):
        _golden_test(path)
    assert path.read_text() == "stale\n"
    path.write_text(PRODUCED)
    _golden_test(path)
