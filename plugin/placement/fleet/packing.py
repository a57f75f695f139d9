"""Whether two independent GPU asks fit a node together, on every row at once (numpy).

Why: the whole-pod search (:mod:`plugin.placement.plan_search`) is plain Python,
tens to hundreds of microseconds per node, and on a busy cluster most of the
nodes the policy's replays refuse have no plan at all: a sidecar's share beside
an app of 1.5 GPUs on nodes without the room. Deciding those nodes exactly here
leaves the search only the nodes where a plan exists.

Two items (a pod of two containers that reuse nothing, or chains of init
containers reduced to their last container, :func:`~plugin.placement.plan_search.independent_items`)
of ``k`` whole GPUs and a remainder ``r`` each fit exactly when one of these holds,
with ``C`` completely free GPUs, ``K`` the whole GPUs both need, and ``n(x)`` the
partly free GPUs with at least ``x`` units free:

* no remainders: ``C >= K``;
* one remainder ``r``: ``n(r) >= 1 and C >= K``, or ``C >= K + 1``;
* remainders ``hi >= lo``: both on one partly free GPU (one has ``hi + lo`` free)
  and ``C >= K``; both on one completely free GPU (``hi + lo <= U``) and
  ``C >= K + 1``; on two partly free GPUs (``n(hi) >= 1 and n(lo) >= 2``) and
  ``C >= K``; ``lo`` on a partly free GPU and ``hi`` on a completely free one, or
  the other way round (``n(lo) >= 1`` suffices for either) and ``C >= K + 1``;
  each on its own completely free GPU, ``C >= K + 2``.

Whole GPUs come only from completely free GPUs (a GPU another pod uses can
never be a container's whole GPU), which is what makes these cases all.
"""

from __future__ import annotations

import numpy as np

from plugin.placement.fleet.arrays import Bools, Ints, row_count, row_max


def two_items_fit(free: Ints, units_per_gpu: Ints, first: int, second: int) -> Bools:
    """Per row of ``free`` (units free per GPU; 0 for unhealthy and padding), whether
    asks of ``first`` and ``second`` units fit together, each never split."""
    upg = units_per_gpu
    k_a, r_a = np.divmod(first, upg)
    k_b, r_b = np.divmod(second, upg)
    hi = np.maximum(r_a, r_b)
    lo = np.minimum(r_a, r_b)
    need = k_a + k_b
    complete = row_count(free == upg[:, None])
    partly = np.where(free < upg[:, None], free, 0)

    def holding(units: Ints) -> Ints:
        return row_count((partly >= units[:, None]) & (partly > 0))

    n_hi, n_lo = holding(hi), holding(lo)
    # (with no remainder, or one, the cases below reduce to the shorter lists above:
    # a remainder of 0 fits anywhere, so "both on one GPU" is the other alone)
    fits: Bools = (
        ((row_max(partly) >= hi + lo) & (complete >= need))
        | ((hi + lo <= upg) & (complete >= need + 1))
        | ((n_hi >= 1) & (n_lo >= 2) & (complete >= need))
        | ((n_lo >= 1) & (complete >= need + 1))
        | (complete >= need + 2)
    )
    return fits
