"""Figures every benchmark prints: percentiles and timed loops, in milliseconds.

One definition, so "p99" means the same thing in every script and in
docs/benchmarks.md: the sample at rank ``round(q/100 × (n-1))`` of the sorted
samples (nearest rank, no interpolation), which is what a reader expects
from a small sample on a noisy machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank; the samples need not be sorted."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def block_p99(samples: Sequence[float], blocks: int) -> tuple[float, float, float]:
    """The median, lowest and highest p99 of ``blocks`` consecutive, equal blocks.

    Samples beyond a whole number of blocks are left out of the blocks (not of
    the pooled figures the caller prints beside it). Needs at least 100 samples
    per block, so each block's p99 is a real tail rather than its maximum.
    """
    size = len(samples) // blocks if blocks >= 1 else 0
    if size < 100:
        raise ValueError(f"{len(samples)} samples cannot make {blocks} blocks of at least 100")
    tails = sorted(percentile(samples[i * size : (i + 1) * size], 99) for i in range(blocks))
    return statistics.median(tails), tails[0], tails[-1]


def timed_ms(fn: Callable[[], object], rounds: int) -> list[float]:
    """Call ``fn`` ``rounds`` times; milliseconds per call."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples
