"""One config vocabulary: the checks every loader uses, with one wording for every error.

Every TOML file neonic reads (scenarios, systems, workloads, plans, sweeps, experiments,
network presets) and every unit parameter goes through these checks, so an error always reads
``<dotted.field>: expected <what>, got <value>`` and the same range is written the same way
everywhere (``an integer >= 1``, ``a number > 0 and <= 1``). The module sits in ``sim/`` (it
imports nothing from neonic), low enough for every layer to reach it.

:class:`Field` describes one field (meaning, unit, default, check) so that a table of fields is
both the validator and the documentation: ``neonic config show`` prints it beside a resolved
scenario and a test keeps the README's field tables in step with it.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["where", "integer", "number", "probability", "boolean", "choice", "string",
           "table", "known_fields", "load_toml", "Field", "describe_range"]

_MISSING = object()


def where(path: str, key: str | int) -> str:
    """``path.key`` (``path[key]`` for list indices); ``key`` alone at the top level."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def describe_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                   hi_open: bool = False) -> str:
    """``">= 1"``, ``"> 0 and <= 1"``, ``""``: one wording of a range for every message."""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}" if isinstance(lo, float)
                     else f"{'>' if lo_open else '>='} {lo}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}" if isinstance(hi, float)
                     else f"{'<' if hi_open else '<='} {hi}")
    return " and ".join(parts)


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    try:  # numpy integers without importing numpy
        import numbers
        return isinstance(value, numbers.Integral)
    except Exception:  # pragma: no cover
        return False


def _is_real(value: Any) -> bool:
    import numbers
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(path: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]`` (either bound optional); floats such as ``1e9`` and
    ``2.0`` are refused: counts in configs are written as integers."""
    ok = _is_int(value) and (lo is None or value >= lo) and (hi is None or value <= hi)
    if not ok:
        rng = describe_range(lo, hi)
        raise ValueError(f"{path}: expected an integer{' ' + rng if rng else ''}, got {value!r}")
    return int(value)


def number(path: str, value: Any, lo: float | None = None, hi: float | None = None, *,
           lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a finite float in the range (``lo_open``/``hi_open`` exclude the bound)."""
    ok = _is_real(value) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        rng = describe_range(lo, hi, lo_open=lo_open, hi_open=hi_open)
        raise ValueError(f"{path}: expected a finite number{' ' + rng if rng else ''}, "
                         f"got {value!r}")
    return float(value)


def probability(path: str, value: Any, *, lo_open: bool = False, hi_open: bool = False) -> float:
    """A probability or fraction: a number >= 0 and <= 1 (bounds excluded when asked)."""
    return number(path, value, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open)


def boolean(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: expected true or false, got {value!r}")
    return value


def choice(path: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{path}: expected one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def string(path: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{path}: expected a non-empty string, got {value!r}")
    return value


def table(path: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path or 'file'}: expected a table, got {type(value).__name__} "
                         f"{value!r}"[:200])
    return value


def known_fields(path: str, data: Mapping[str, Any], known: Sequence[str]) -> None:
    """Refuse any key of ``data`` that is not in ``known`` (a typo is never ignored)."""
    for key in data:
        if key not in known:
            hint = _close_match(str(key), known)
            raise ValueError(f"{where(path, key)}: unknown field"
                             f"{f' (did you mean {hint!r}?)' if hint else ''}; "
                             f"expected one of {', '.join(known)}")


def _close_match(key: str, known: Sequence[str]) -> str | None:
    import difflib
    found = difflib.get_close_matches(key, [str(k) for k in known], n=1, cutoff=0.75)
    return found[0] if found else None


def load_toml(path: Path | str, what: str = "config file") -> dict[str, Any]:
    """Parse a TOML file; every failure is a ``ValueError`` that names the file and says what
    was expected (missing, a folder, not text, a syntax error with its line)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a folder; expected a TOML file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{what} {path}: does not exist") from None
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot be read ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path}: not a UTF-8 text file (byte {e.start}); "
                         f"expected a TOML file") from None
    if "\0" in text:
        raise ValueError(f"{what} {path}: binary data (NUL byte); expected a TOML file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{what} {path}: not valid TOML: {e}") from None


@dataclass(frozen=True)
class Field:
    """One documented config field: its dotted name, meaning, unit, default and check.

    ``check(path, value)`` returns the normalised value or raises ``ValueError`` naming
    ``path``; ``default`` is ``None`` for a required field or one derived from others
    (``derived`` then says from what)."""

    name: str
    meaning: str
    unit: str = ""
    default: Any = None
    check: Callable[[str, Any], Any] | None = None
    derived: str = ""
    choices: tuple[str, ...] = field(default=())

    def validate(self, value: Any) -> Any:
        if self.choices:
            return choice(self.name, value, self.choices)
        return self.check(self.name, value) if self.check else value

    def expected(self) -> str:
        """What the field takes, in the words the error messages use."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        try:
            self.validate(_MISSING)
        except ValueError as e:
            text = str(e)
            return text.split(": expected ", 1)[1].rsplit(", got ", 1)[0] if (
                ": expected " in text) else ""
        return ""
