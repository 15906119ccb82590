"""Options flow one way: config file < environment defaults < flags, into one frozen namespace.

A config file (YAML) maps the flag names, without the leading dashes, to values of the right
type: `flush-interval: 5s`, `pid: [1234, 5678]`, `web.listen-address: "127.0.0.1:9961"`,
`otlp.endpoint: http://collector:4317`. Values are checked with the same converters as the flags,
so a wrong type is an error at start-up.

Flags follow node_exporter's style: the options of a component are `--component.option`
(`--web.listen-address`, `--log.level`, `--otlp.endpoint`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

import yaml

__all__ = [
    "ConfigError",
    "Duration",
    "apply_config_file",
    "config_path",
    "format_duration",
    "parse_duration",
    "parse_regex",
    "parse_seconds",
    "positive_int",
    "seconds",
]


class ConfigError(Exception):
    pass


# Go's time.ParseDuration units (https://pkg.go.dev/time#ParseDuration), as Prometheus and the
# exporters scraped with it take durations: `500ms`, `10s`, `1m30s`, `2h`.
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})(ns|us|µs|μs|ms|s|m|h)")
_BARE = re.compile(_NUMBER)


def _nanoseconds(text: str, bare_unit: str) -> float:
    s = str(text).strip()
    if _BARE.fullmatch(s):
        return float(s) * _UNIT_NS[bare_unit]
    total, at = 0.0, 0
    for m in _PART.finditer(s):
        if m.start() != at:
            break
        total += float(m.group(1)) * _UNIT_NS[m.group(2)]
        at = m.end()
    if at == 0 or at != len(s):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r} (use e.g. 500ms, 10s, 1m30s, 2h; a bare number is in {bare_unit})"
        )
    return total


def parse_duration(text: str, default_unit: str = "us") -> int:
    """A duration in nanoseconds, Go-style (`500us`, `10ms`, `1m30s`); a bare number is in `default_unit`."""
    return round(_nanoseconds(text, default_unit))


def parse_seconds(text: str) -> float:
    """Seconds as a float: `5`, `0.5`, `500ms`, `2m`."""
    return _nanoseconds(text, "s") / 1e9


class Duration:
    """The argparse type of every time option: a Go-style duration (`500ms`, `10s`, `1m30s`, `2h`),
    returned as a number of `unit`s (nanoseconds as an int); a bare number is in `bare_unit`,
    which defaults to `unit`, so every option keeps the unit its bare numbers always had."""

    def __init__(self, unit: str = "s", bare_unit: str | None = None, allow_zero: bool = False) -> None:
        self.unit = unit
        self.bare_unit = bare_unit or unit
        self.allow_zero = allow_zero
        self.__name__ = "duration"

    def __call__(self, text: str) -> float:
        ns = _nanoseconds(text, self.bare_unit)
        if (ns == 0 and not self.allow_zero) or ns < 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return round(ns) if self.unit == "ns" else ns / _UNIT_NS[self.unit]

    def __repr__(self) -> str:
        return f"Duration({self.unit!r}, bare_unit={self.bare_unit!r})"


seconds = Duration("s")


def format_duration(value: float, unit: str = "s") -> str:
    """`90.0` -> `1m30s`, `0.5` -> `500ms`: how --help shows a default, in the syntax the option takes."""
    ns = round(value * _UNIT_NS[unit])
    if ns == 0:
        return "0s"
    out = []
    for name in ("h", "m", "s", "ms", "us", "ns"):
        n, ns = divmod(ns, _UNIT_NS[name])
        if n:
            out.append(f"{n}{name}")
    return "".join(out)


def parse_regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"invalid regular expression {text!r}: {e}") from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    by_name: dict[str, argparse.Action] = {}
    for action in parser._actions:
        for opt in action.option_strings:
            if opt.startswith("--"):
                by_name[opt[2:]] = action
        if action.dest:
            by_name.setdefault(action.dest, action)
    return by_name


def _convert(action: argparse.Action, name: str, value: Any) -> Any:
    def one(v: Any) -> Any:
        if isinstance(v, (dict, list)):
            raise ConfigError(f"{name}: expected a single value, got {type(v).__name__}")
        if isinstance(v, bool) and action.type not in (None, str):
            raise ConfigError(f"{name}: expected {getattr(action.type, '__name__', 'a value')}, got a boolean")
        converted = v
        if action.type is not None:
            try:
                converted = action.type(str(v))  # type: ignore[operator]
            except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
                raise ConfigError(f"{name}: {e}") from None
        elif not isinstance(v, (str, int, float)):
            raise ConfigError(f"{name}: expected a string, got {type(v).__name__}")
        else:
            converted = str(v)
        if action.choices is not None and converted not in action.choices:
            raise ConfigError(f"{name}: {v!r} is not one of {', '.join(map(str, action.choices))}")
        return converted

    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        if isinstance(action, argparse._StoreFalseAction):
            return not value
        return value
    if isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+"):
        values = value if isinstance(value, list) else [value]
        return [one(v) for v in values]
    return one(value)


def apply_config_file(parser: argparse.ArgumentParser, path: str) -> None:
    """Load `path` and make its values the parser's defaults (flags still override them)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{at}") from None
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of option names to values")
    actions = _actions(parser)
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key)
        action = actions.get(name) or actions.get(name.replace("_", "-"))
        if action is None or name in ("config", "config.file", "help"):
            raise ConfigError(f"config file {path}: unknown option {str(key)!r}")
        defaults[action.dest] = _convert(action, name, value)
    parser.set_defaults(**defaults)


def config_path(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config.file" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config.file="):
            return arg.split("=", 1)[1]
    return None
