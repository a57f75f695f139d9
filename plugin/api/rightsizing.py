"""The recommended share for a container: the one formula every right-sizing view uses.

The recording rule ``metagpu:container_recommended_units:1d``
(chart/rules/metagpu-usage.yaml), ``metagpu usage --rightsize``
(:mod:`metagpu.usage`) and the node agent's own window (``mgctl get
rightsize``, ``metagpu_container_recommended_units``) all recommend the same
share for the same peak: here for the two in Python, restated in PromQL for the
rule (``tests/monitoring`` checks both on the same cases).
"""

from __future__ import annotations

import math
from typing import Final

HEADROOM: Final = 1.1
"""The recommended share is the window's peak memory plus 10%."""


def recommended_units(*, memory_peak: float, units_per_gpu: int) -> int:
    """Whole units (what the webhook accepts) for the peak memory plus headroom, 1..units_per_gpu.

    ``memory_peak`` is the peak as a fraction of the GPU's memory (0-1). Memory
    is the floor because it is the limit the agent enforces; SM is shared, so it
    is shown as evidence only. The same arithmetic as the recording rule
    ``metagpu:container_recommended_units:1d``; the ``- 1e-9`` keeps
    0.2 × 1.1 × 100 (22.000000000000004 in floating point) at 22 units, not 23.
    """
    wanted = math.ceil(min(memory_peak * HEADROOM, 1.0) * units_per_gpu - 1e-9)
    return max(1, min(units_per_gpu, wanted))
