"""The figures every benchmark prints mean what docs/benchmarks.md says they mean."""

from __future__ import annotations

import pytest

from tests.benchmarks._stats import block_p99, percentile


def test_percentile_is_nearest_rank() -> None:
    samples = [float(v) for v in range(1, 101)]  # 1..100, shuffled order must not matter
    assert percentile(list(reversed(samples)), 50) == 51.0  # rank round(0.5 * 99) = 50
    assert percentile(samples, 99) == 99.0
    assert percentile(samples, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 99)


def test_a_burst_in_one_block_does_not_set_the_block_p99() -> None:
    quiet = [1.0] * 97 + [2.0] * 3  # every block's own tail: p99 = 2
    burst = [50.0] * 20 + [1.0] * 80  # a neighbour's burst, one block only
    samples = quiet * 2 + burst + quiet * 2
    assert percentile(samples, 99) == 50.0  # the pooled p99 is the burst
    assert block_p99(samples, 5) == (2.0, 2.0, 50.0)  # median, lowest, highest


def test_a_tail_in_every_block_is_kept() -> None:
    block = [1.0] * 95 + [9.0] * 5  # the code's own tail recurs everywhere
    assert block_p99(block * 5, 5) == (9.0, 9.0, 9.0)


def test_leftover_samples_are_not_a_block_and_small_blocks_are_refused() -> None:
    samples = [1.0] * 200 + [99.0] * 99  # 299 samples: two blocks of 149, 1 left over
    assert block_p99(samples, 2)[0] == pytest.approx((1.0 + 99.0) / 2)
    with pytest.raises(ValueError, match="cannot make 3 blocks of at least 100"):
        block_p99([1.0] * 299, 3)
    with pytest.raises(ValueError, match="cannot make 0 blocks"):
        block_p99([1.0] * 100, 0)
