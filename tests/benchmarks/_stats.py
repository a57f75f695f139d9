"""Figures every benchmark prints: percentiles and timed loops, in milliseconds.

One definition, so "p99" means the same thing in every script and in
docs/benchmarks.md: the sample at rank ``round(q/100 × (n-1))`` of the sorted
samples (nearest rank, no interpolation), which is what a reader expects
from a small sample on a noisy machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank; the samples need not be sorted."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def timed_ms(fn: Callable[[], object], rounds: int) -> list[float]:
    """Call ``fn`` ``rounds`` times; milliseconds per call."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples
