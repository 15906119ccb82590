"""Options flow one way: config file < environment defaults < flags, into one frozen namespace.

A config file (YAML) maps long option names, without the leading dashes, to values of the right
type: `flush-interval: 5`, `pid: [1234, 5678]`, `web.listen-address: "127.0.0.1:9961"`. Values are
checked with the same converters as the flags, so a wrong type is an error at start-up.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

import yaml

__all__ = ["ConfigError", "apply_config_file", "parse_duration", "parse_regex", "positive_float", "positive_int"]


class ConfigError(Exception):
    pass


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|m|h)?\s*$")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
            "h": 3_600_000_000_000}


def parse_duration(text: str, default_unit: str = "us") -> int:
    """A duration in nanoseconds: `500us`, `10ms`, `2s`; a bare number is in `default_unit`."""
    m = _DURATION.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use e.g. 500us, 10ms, 2s)")
    return int(float(m.group(1)) * _UNIT_NS[m.group(2) or default_unit])


def parse_seconds(text: str) -> float:
    """Seconds as a float: `5`, `0.5`, `500ms`, `2m`."""
    return parse_duration(text, default_unit="s") / 1e9


def parse_regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"invalid regular expression {text!r}: {e}") from None


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: a plain number of `kind` (int, float) that must be above zero."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = parse_seconds(text)
    except argparse.ArgumentTypeError:
        raise
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
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
        if action is None or name in ("config", "help"):
            raise ConfigError(f"config file {path}: unknown option {name!r}")
        defaults[action.dest] = _convert(action, name, value)
    parser.set_defaults(**defaults)


def config_path(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None
