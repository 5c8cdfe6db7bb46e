"""A rule's parameters (`[params.NAME]`): their type from the default, their bounds, and coercing a TOML value or
a `--set` string to that type with one sentence saying what is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    name: str
    default: Any
    reason: str
    min: float | None = None
    max: float | None = None
    choices: tuple = ()

    @property
    def kind(self) -> str:
        """bool | int | float | str | list, from the default's type."""
        value = self.default
        if isinstance(value, bool):
            return "bool"
        if isinstance(value, int):
            return "int"
        if isinstance(value, float):
            return "float"
        if isinstance(value, list):
            return "list"
        return "str"

    def allowed(self) -> str:
        """What values this parameter accepts, as words for an error message."""
        kind = self.kind
        if kind == "bool":
            return "true or false"
        if kind == "list":
            return "a comma-separated list"
        if kind == "str":
            return "one of " + ", ".join(map(str, self.choices)) if self.choices else "text"
        noun = "an integer" if kind == "int" else "a number"
        if self.min is not None and self.max is not None:
            return f"{noun} from {_fmt(self.min)} to {_fmt(self.max)}"
        if self.min is not None:
            return f"{noun} of at least {_fmt(self.min)}"
        if self.max is not None:
            return f"{noun} of at most {_fmt(self.max)}"
        return noun

    def coerce(self, value: Any) -> Any:
        """`value` (from TOML or a --set string) as this parameter's type; ValueError when not allowed."""
        kind = self.kind
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if kind == "list":
            if isinstance(value, list):
                return [str(v) for v in value]
            return [part.strip() for part in str(value).split(",") if part.strip()]
        if kind in ("int", "float"):
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, str):
                value = float(value.strip()) if kind == "float" else _parse_int(value)
            if kind == "int":
                if isinstance(value, float):
                    if not value.is_integer():
                        raise ValueError
                    value = int(value)
            else:
                value = float(value)
            if value != value:  # NaN
                raise ValueError
            if self.min is not None and value < self.min:
                raise ValueError
            if self.max is not None and value > self.max:
                raise ValueError
            return value
        value = str(value)
        if self.choices and value not in self.choices:
            raise ValueError
        return value


def _parse_int(text: str) -> int:
    number = float(text.strip())
    if not number.is_integer():
        raise ValueError
    return int(number)


def _fmt(number: float) -> str:
    return f"{number:g}"
