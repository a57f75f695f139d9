"""The batcher that runs the reviews of one event-loop iteration back to back."""

from __future__ import annotations

import asyncio

import pytest

from webhook.batching import Batcher


class Recorder:
    """A work function that records what it ran and can be told to fail."""

    def __init__(self, fail_on: dict[int, BaseException] | None = None) -> None:
        self.ran: list[int] = []
        self._fail_on = fail_on or {}

    def __call__(self, item: int) -> str:
        self.ran.append(item)
        if item in self._fail_on:
            raise self._fail_on[item]
        return f"done {item}"


async def test_items_submitted_together_run_together_in_order() -> None:
    work = Recorder()
    batcher = Batcher(work)
    futures = [batcher.submit(i) for i in range(5)]
    assert batcher.queued == 5
    assert work.ran == []  # nothing runs inside submit
    assert await futures[0] == "done 0"
    # One callback answered them all: the last is resolved as soon as the first is.
    assert all(f.done() for f in futures)
    assert [f.result() for f in futures] == [f"done {i}" for i in range(5)]
    assert work.ran == [0, 1, 2, 3, 4]
    assert batcher.queued == 0


async def test_a_later_submission_starts_a_new_batch() -> None:
    work = Recorder()
    batcher = Batcher(work)
    assert await batcher.submit(1) == "done 1"
    assert await batcher.submit(2) == "done 2"
    assert work.ran == [1, 2]


async def test_one_failing_item_fails_alone() -> None:
    work = Recorder(fail_on={1: RuntimeError("boom")})
    batcher = Batcher(work)
    futures = [batcher.submit(i) for i in range(3)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert results[0] == "done 0"
    assert isinstance(results[1], RuntimeError)
    assert str(results[1]) == "boom"
    assert results[2] == "done 2"


async def test_a_cancelled_request_is_skipped() -> None:
    work = Recorder()
    batcher = Batcher(work)
    gone, kept = batcher.submit(1), batcher.submit(2)
    gone.cancel()
    assert await kept == "done 2"
    assert work.ran == [2]


async def test_a_dying_process_leaves_no_request_waiting() -> None:
    """KeyboardInterrupt / SystemExit propagate, and the rest of the batch is cancelled."""
    work = Recorder(fail_on={1: KeyboardInterrupt()})
    batcher = Batcher(work)
    futures = [batcher.submit(i) for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        batcher._run()  # what the scheduled callback does, run here to catch the exception
    assert futures[0].result() == "done 0"
    assert futures[1].cancelled()
    assert futures[2].cancelled()
    assert work.ran == [0, 1]
    await asyncio.sleep(0)  # the callback submit scheduled finds an empty queue
    assert work.ran == [0, 1]
