"""``neonic rtl export|sim cache``: the registration; the driver is ``sim.units.cache``."""

from __future__ import annotations

from neonic.host.units import UnitEntry
from neonic.sim.units import cache as driver

UNIT = UnitEntry(
    name="cache",
    summary="set-associative write-back cache of embedding rows (LRU/LFU, MSHRs, merging)",
    build=driver.build,
    simulate=driver.simulate,
    options=(("requests", "number of random requests of the default workload"),),
)
