"""Argument types and checks shared by the subcommands, so a bad argument is refused by name
before any work starts (argparse then exits with status 2 and ``argument --seed: ...``)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["seed", "positive_int", "input_file", "output_folder", "output_file",
           "prepare_output_folder", "unique_params"]


def _int(text: str, lo: int, what: str) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < lo:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def seed(text: str) -> int:
    """A random seed: an integer >= 0 (numpy refuses negative seeds)."""
    return _int(text, 0, "an integer >= 0")


def positive_int(text: str) -> int:
    return _int(text, 1, "an integer >= 1")


def input_file(text: str) -> Path:
    """An existing regular file (not a folder)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder; expected a file")
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path


def output_folder(text: str) -> Path:
    """A results folder: absent (it is created) or an existing folder, never a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: exists and is not a folder; expected a "
                                         f"folder (new or existing)")
    return path


def output_file(text: str) -> Path:
    """A file to write: not an existing folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder; expected a file name")
    return path


def prepare_output_folder(path: Path, flag: str = "--out") -> Path:
    """Create the results folder now (before the run), naming ``flag`` when that fails."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"{flag} {path}: exists and is not a folder") from None
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot create the folder ({e.strerror or e})") from None
    probe = path / ".neonic-write-test"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    return path


def unique_params(pairs: list[str] | None, flag: str = "--param") -> list[str]:
    """``KEY=VALUE`` pairs with each key at most once (a repeated key is refused, never
    silently overridden by the last)."""
    seen: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag}: expected KEY=VALUE, got {pair!r}")
        key = key.strip()
        if key in seen:
            raise ValueError(f"{flag} {key}: given twice ({key}={seen[key]} and {pair}); "
                             f"expected each parameter at most once")
        seen[key] = value.strip()
    return list(pairs or [])
