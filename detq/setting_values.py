"""Setting fields and their readers, which turn a DETQ_* string or a value into its type or say why not."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, field
from pathlib import Path
from typing import Any

from detq.errors import DetqError

Reader = Callable[[Any], Any]

_TRUE = frozenset({"1", "true", "yes", "on", "t", "y"})
_FALSE = frozenset({"0", "false", "no", "off", "f", "n"})


class BadValue(ValueError):
    """A value a setting cannot take; its message says what the setting takes."""


def setting(
    default: Any = MISSING, *, read: Reader, doc: str, factory: Callable[[], Any] | None = None
) -> Any:
    """A field of Settings: its default (or a factory of it), the reader of its values, what it does."""
    metadata = {"read": read, "doc": doc}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


class SettingsError(DetqError):
    """DETQ_* values (or arguments) a setting cannot take, each named with what it takes."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def read_values(
    specs: Iterable[Field[Any]], given: Mapping[str, Any], variable: Callable[[str], str], *, defaults: bool
) -> dict[str, Any]:
    """The given values of these fields, each read by its reader; with defaults, the others' defaults too.

    A name no field has is a TypeError (a caller's mistake); values that cannot be read are a SettingsError
    naming each, as variable(name) spells it.
    """
    specs = list(specs)
    unknown = sorted(set(given) - {spec.name for spec in specs})
    if unknown:
        raise TypeError(f"no such settings: {unknown}")
    values: dict[str, Any] = {}
    problems: list[str] = []
    for spec in specs:
        if spec.name in given:
            try:
                values[spec.name] = spec.metadata["read"](given[spec.name])
            except BadValue as exc:
                problems.append(f"{variable(spec.name)}: {exc}")
        elif defaults:
            factory = spec.default_factory
            values[spec.name] = factory() if factory is not MISSING else spec.default
    if problems:
        raise SettingsError(problems)
    return values


def text(pattern: str | None = None, hint: str = "") -> Reader:
    """A string, matching pattern (a full match) where one is given."""
    compiled = re.compile(pattern) if pattern is not None else None

    def read(value: Any) -> str:
        if not isinstance(value, str):
            raise BadValue(f"must be text, not {value!r}")
        if compiled is not None and compiled.fullmatch(value) is None:
            raise BadValue(f"must be {hint or f'text matching {pattern}'}, not {value!r}")
        return value

    return read


def path(value: Any) -> Path:
    """A filesystem path, kept as given (relative paths resolve where it is used)."""
    if isinstance(value, Path):
        return value
    if isinstance(value, str) and value:
        return Path(value)
    raise BadValue(f"must be a path, not {value!r}")


def integer(ge: int | None = None, le: int | None = None) -> Reader:
    """A whole number within [ge, le]."""

    def read(value: Any) -> int:
        if isinstance(value, bool):
            raise BadValue(f"must be a whole number, not {value!r}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise BadValue(f"must be a whole number, not {value!r}") from None
        if not isinstance(value, int):
            raise BadValue(f"must be a whole number, not {value!r}")
        _check_bounds(value, ge=ge, le=le)
        return value

    return read


def number(ge: float | None = None, gt: float | None = None, le: float | None = None) -> Reader:
    """A finite number within the bounds given."""

    def read(value: Any) -> float:
        if isinstance(value, bool):
            raise BadValue(f"must be a number, not {value!r}")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise BadValue(f"must be a number, not {value!r}") from None
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise BadValue(f"must be a finite number, not {value!r}")
        _check_bounds(value, ge=ge, le=le)
        if gt is not None and not value > gt:
            raise BadValue(f"must be greater than {gt}, not {value}")
        return float(value)

    return read


def boolean(value: Any) -> bool:
    """true/false, yes/no, on/off, 1/0 (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise BadValue(f"must be true or false, not {value!r}")


def choice(kind: type[enum.StrEnum]) -> Reader:
    """One of a string enum's values."""

    def read(value: Any) -> enum.StrEnum:
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(member.value for member in kind)
            raise BadValue(f"must be one of {allowed}, not {value!r}") from None

    return read


MAX_INPUT_SIDE = 16384


def size(value: Any) -> tuple[int, int]:
    """(height, width): one number for a square, "H,W" or "HxW" text, or a pair."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.lower().replace("x", ",").split(",")]
        try:
            value = [int(p) for p in parts]
        except ValueError:
            raise BadValue(f"must be 'H,W' or one number (a square), not {value!r}") from None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list | tuple) or len(value) not in (1, 2):
        raise BadValue(f"must be 'H,W' or one number (a square), not {value!r}")
    sides = (value[0], value[-1])
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_INPUT_SIDE for v in sides):
        raise BadValue(f"sides must be whole numbers from 1 to {MAX_INPUT_SIDE}, not {value!r}")
    return (int(sides[0]), int(sides[1]))


def names(value: Any) -> tuple[str, ...]:
    """A comma-separated list (or a list) of names, each stripped; empty: none."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str | int) for i in items):
        raise BadValue(f"must be names separated by commas, not {value!r}")
    return tuple(dict.fromkeys(str(i).strip() for i in items if str(i).strip()))


def optional(reader: Reader) -> Reader:
    """reader's value, or None for None."""

    def read(value: Any) -> Any:
        return None if value is None else reader(value)

    return read


def _check_bounds(value: float, *, ge: float | None, le: float | None) -> None:
    if ge is not None and value < ge:
        raise BadValue(f"must be at least {ge}, not {value}")
    if le is not None and value > le:
        raise BadValue(f"must be at most {le}, not {value}")
