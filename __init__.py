"""neonic: a cycle-approximate model of Neo-style DLRM training and inference on GPU clusters
with SmartNICs.

The repository's top-level folders are this package's subpackages: ``neonic.rtl`` (Amaranth
hardware), ``neonic.sim`` (simulation engines, reference and timing models, the network) and
``neonic.host`` (the runtime, planner, experiments and the ``neonic`` command line). Imports
point downward only: host -> sim -> rtl.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("neonic")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
