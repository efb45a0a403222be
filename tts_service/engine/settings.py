"""A setting is declared once: one dataclass field holds its default, the check its value must pass, and, for a
setting the server exposes, its help text, its flag's name where that is not the field's name, and how the flag's
text reads where the field's type does not say.

The server generates its flags and environment variables from these fields (`tts_service/api/config.py`); each
configuration applies the checks in its `__post_init__` with `check_fields`. The module lives in the engine so that
the engine's configuration can declare its settings without importing the API.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_METADATA_KEY = "setting"


@dataclass(frozen=True)
class Check:
    """What a setting's value must be, in the words of its refusal: "must be {requirement}"."""

    requirement: str
    holds: Callable[[Any], bool]


def _is_finite(value: float) -> bool:
    # An int can be too large for a float, and is finite whatever its size.
    return isinstance(value, int) or math.isfinite(value)


def at_least(minimum: int) -> Check:
    # An infinite limit would be no limit, and the sizes derived from it would overflow.
    return Check(f">= {minimum}", lambda value: _is_finite(value) and value >= minimum)


def above(minimum: int) -> Check:
    return Check(f"> {minimum}", lambda value: _is_finite(value) and value > minimum)


def one_of(*choices: str) -> Check:
    return Check(f"one of {', '.join(choices)}", lambda value: value in choices)


def count_or_off(text: str) -> int | None:
    """A count that 'off' (or 'none') turns off, for an optional count's flag."""
    if text.strip().lower() in ("off", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be a whole number or off, got {text[:20]!r}") from None


@dataclass(frozen=True)
class Setting:
    help: str = ""  # empty: no server flag sets it
    flag: str | None = None  # the flag's name, where it is not the field's name with dashes
    check: Check | None = None  # for every value but None, which means unset
    parse: Callable[[str], Any] | None = None  # the flag's text to a value, where the field's type does not say
    secret: bool = False  # never shown: not in repr, not in a refusal


def setting(default: Any, help_text: str = "", *, flag: str | None = None, check: Check | None = None,
            parse: Callable[[str], Any] | None = None, secret: bool = False) -> Any:
    """A dataclass field declaring a setting; with `help_text`, the server has a flag for it."""
    declared = Setting(help_text, flag, check, parse, secret)
    return dataclasses.field(default=default, repr=not secret, metadata={_METADATA_KEY: declared})


def declaration(item: dataclasses.Field[Any]) -> Setting:
    return item.metadata.get(_METADATA_KEY, _UNDECLARED)


_UNDECLARED = Setting()


class SettingError(ValueError):
    """A setting's value fails its check: names the field and what it must be."""

    def __init__(self, owner: type, name: str, requirement: str) -> None:
        super().__init__(f"{owner.__name__}.{name} must be {requirement}")
        self.name = name
        self.requirement = requirement


def check_fields(config: Any) -> None:
    """Every field's declared check, in the order of the fields."""
    for item in dataclasses.fields(config):
        declared = declaration(item)
        value = getattr(config, item.name)
        if declared.check is None or value is None or declared.check.holds(value):
            continue
        got = "" if declared.secret else f", got {_shown(value)}"
        raise SettingError(type(config), item.name, declared.check.requirement + got)


def require(config: Any, condition: bool, name: str, requirement: str) -> None:
    """A check that reads more than one field, refused as the field `name`'s own."""
    if not condition:
        raise SettingError(type(config), name, requirement)


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)
