"""Every time option of every subcommand and output takes the same duration syntax (Go's: `500ms`, `10s`,
`1m30s`, `2h`), on the command line and in the config file; a bare number keeps the option's own unit.
The options are found by walking the real parser, so a time option added later with another type fails."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from offcpu_exporter import cli
from offcpu_exporter.config import Duration, format_duration, parse_duration

NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
# (spelling, nanoseconds, or None for "a bare number: in the option's unit")
SPELLINGS = [("500ms", 500 * NS["ms"]), ("10s", 10 * NS["s"]), ("1m30s", 90 * NS["s"]), ("2h", 2 * NS["h"]),
             ("250us", 250 * NS["us"]), ("1.5m", 90 * NS["s"]), ("1h2m3.5s", 3723_500 * NS["ms"]), ("7", None)]
BAD = ["", "10 parsecs", "1m30", "-1s", "s", "1s2", "ten", "10 s"]
# Names that say "time" but are not durations: a point in time (milliseconds since the epoch).
NOT_DURATIONS = {"--skywalking.task-start-time"}
TIME_WORDS = ("interval", "timeout", "seconds", "minutes", "grace", "duration", "delay", "history", "block", "time")


def subcommands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def time_options() -> list[tuple[str, str, Duration]]:
    found = []
    for command, sub in subcommands():
        for action in sub._actions:
            if isinstance(action.type, Duration):
                found.append((command, action.option_strings[-1], action.type))
    return found


def _required(command: str) -> list[str]:
    return ["--all"] if command == "record" else []


def test_every_time_option_is_a_duration() -> None:
    for command, sub in subcommands():
        for action in sub._actions:
            names = [o for o in action.option_strings if o.startswith("--")]
            timely = any(w in n for n in names for w in TIME_WORDS) and not set(names) & NOT_DURATIONS
            if timely and action.nargs != 0:
                assert isinstance(action.type, Duration), f"{command} {names}: {action.type!r} is not a Duration"
    found = {name for _, name, _ in time_options()}
    assert {"--flush-interval", "--duration", "--min-block", "--web.idle-timeout"} <= {
        n.replace("-", ".", 1) if n.startswith("--web-") else n for n in found
    } | found, found
    assert len(found) >= 15, found


@pytest.mark.parametrize("command,option,kind", time_options(), ids=lambda v: v if isinstance(v, str) else "")
def test_same_spellings_everywhere(command: str, option: str, kind: Duration, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    dest = next(a.dest for c, sub in subcommands() if c == command for a in sub._actions
                if option in a.option_strings)
    for spelling, ns in SPELLINGS:
        expected_ns = ns if ns is not None else 7 * NS[kind.bare_unit]
        expected = expected_ns if kind.unit == "ns" else expected_ns / NS[kind.unit]
        options = cli.parse_args([command, *_required(command), option, spelling])
        assert getattr(options, dest) == pytest.approx(expected), (option, spelling)
        config = tmp_path / "c.yml"
        config.write_text(f"{option[2:]}: {spelling}\n")
        from_file = cli.parse_args([command, *_required(command), "--config.file", str(config)])
        assert getattr(from_file, dest) == pytest.approx(expected), (option, spelling, "config file")
    for bad in BAD:
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args([command, *_required(command), option, bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("offcpu-exporter: error:") and len(err.strip().splitlines()) == 1, err
        assert option in err or "duration" in err, err


def test_help_defaults_are_durations() -> None:
    assert format_duration(90) == "1m30s" and format_duration(0.5) == "500ms" and format_duration(60, "m") == "1h"
    for command, sub in subcommands():
        text = sub.format_help()
        assert "SECONDS" not in text, f"{command} --help still shows SECONDS"


def test_block_durations_stay_in_microseconds_when_bare() -> None:
    assert parse_duration("5") == 5_000
    options = cli.parse_args(["record", "--all", "--min-block", "100", "--max-block", "1s"])
    assert (options.min_block, options.max_block) == (100_000, 1_000_000_000)
