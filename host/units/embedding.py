"""``neonic rtl export|sim embedding``: the registration; the driver is ``sim.units.embedding``."""

from __future__ import annotations

from neonic.host.units import UnitEntry
from neonic.sim.units import embedding as driver

UNIT = UnitEntry(
    name="embedding",
    summary="table-batched EmbeddingBag gather/pool unit (SUM/MEAN/MAX, fp32/fp16/bf16)",
    build=driver.build,
    simulate=driver.simulate,
)
