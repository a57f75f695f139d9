"""One pass of the webhook's "why a DRA pod waits" Events at 1,000 nodes × 8 GPUs.

Every GPU holds a 60-unit share (8,000 allocated claims, the captured claim moved to each
node and GPU), and 100 Pending pods of five sizes (70 to 110 units) fit nowhere. The
pass (:func:`webhook.dra_waiting.notes_for`, run in a worker thread beside the event
loop that answers admission reviews) builds one board and judges every node once per
distinct request:

* **pass**: ``notes_for`` on the trimmed lists, 100 pods;
* **decode (baseline)**: decoding and trimming the same lists from their JSON bodies, the
  cost of merely reading what the pass judges (``_page``, in pages of ``PAGE_SIZE`` as the
  webhook reads them), with the cyclic collector paused as the webhook pauses it
  (``collector_paused``); and with it on, as before;
* **one page**: a single page decode, as long as it holds the interpreter from the event
  loop that answers admission reviews (its p99 with the collector on is a full collection).

Run: ``.venv/bin/python -m tests.benchmarks.dra_waiting [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks._stats import percentile, timed_ms
from tests.plugin.dra.fixtures import DRIVER, load
from webhook.dra_waiting import (
    PAGE_SIZE,
    _page,
    collector_paused,
    notes_for,
    trim_claim,
    trim_slice,
)

NODES = 1000
GPUS = 8
PODS = 100


def pages(items: list[dict[str, Any]]) -> list[bytes]:
    return [
        json.dumps({"metadata": {}, "items": items[i : i + PAGE_SIZE]}).encode()
        for i in range(0, len(items), PAGE_SIZE)
    ]


def build(nodes: int) -> tuple[list[bytes], list[bytes], list[dict[str, Any]]]:
    base = load("resourceslice-consumable-accepted.json")["response"]["body"]
    sixty = load("claim-60-units-a-allocated.json")
    slices, claims = [], []
    for n in range(nodes):
        piece = copy.deepcopy(base)
        piece["metadata"]["name"] = f"node-{n:04d}-{DRIVER}"
        piece["spec"]["nodeName"] = piece["spec"]["pool"]["name"] = f"node-{n:04d}"
        devices = piece["spec"]["devices"]
        while len(devices) < GPUS:
            extra = copy.deepcopy(devices[0])
            extra["name"] = f"gpu-{len(devices)}"
            devices.append(extra)
        slices.append(piece)
        for g in range(GPUS):
            claim = copy.deepcopy(sixty)
            claim["metadata"]["name"] = f"c-{n}-{g}"
            for result in claim["status"]["allocation"]["devices"]["results"]:
                result["pool"], result["device"] = f"node-{n:04d}", f"gpu-{g}"
            claims.append(claim)
    pending = load("event-70-units-unschedulable.json")
    pods = []
    for i in range(PODS):
        claim = copy.deepcopy(pending["claim"])
        claim["metadata"]["name"] = f"w-{i}"
        asked = claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]
        asked["units"] = str(70 + 10 * (i % 5))
        claims.append(claim)
        pod = copy.deepcopy(pending["pod"])
        pod["metadata"].update(name=f"p-{i}", uid=f"uid-{i}")
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": f"w-{i}"}]
        pods.append(pod)
    return pages(slices), pages(claims), pods


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    nodes, rounds = (100, 3) if args.quick else (NODES, 9)
    slice_pages, claim_pages, pods = build(nodes)
    # The fixtures copied to build the bodies are this script's, not the webhook's heap:
    # kept out of the collector's sight, so a page's figure is the webhook's, whose heap
    # holds only its caches and the pass's trimmed items.
    gc.collect()
    gc.freeze()
    pages_ms: dict[bool, list[float]] = {True: [], False: []}
    longest: dict[bool, list[float]] = {True: [], False: []}

    def decode_with(paused: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        out: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
        worst = 0.0
        with collector_paused() if paused else contextlib.nullcontext():
            for bodies, trim, into in (
                (slice_pages, trim_slice, out[0]),
                (claim_pages, trim_claim, out[1]),
            ):
                for body in bodies:
                    start = time.perf_counter()
                    into.extend(_page(body, trim)[0])
                    took = (time.perf_counter() - start) * 1000
                    pages_ms[paused].append(took)
                    worst = max(worst, took)
        longest[paused].append(worst)
        return out

    slices, claims = decode_with(True)

    def one_pass() -> object:
        with collector_paused():
            return notes_for(pods, slices=slices, claims=claims, driver=DRIVER, device_class=DRIVER)

    notes = notes_for(pods, slices=slices, claims=claims, driver=DRIVER, device_class=DRIVER)
    assert len(notes) == PODS, len(notes)
    collected = timed_ms(lambda: decode_with(False), rounds)
    decoded = timed_ms(lambda: decode_with(True), rounds)
    passed = timed_ms(one_pass, rounds)
    print(
        f"{nodes} nodes x {GPUS} GPUs, {len(claims)} claims, {PODS} waiting pods, {rounds} rounds"
    )
    for label, samples in (
        ("decode, collector on", collected),
        ("decode (baseline)", decoded),
        ("pass", passed),
    ):
        print(
            f"  {label:24s} p50 {statistics.median(samples):8.1f} ms   "
            f"p99 {percentile(samples, 99):8.1f} ms"
        )
    for paused, label in ((False, "collector on"), (True, "collector paused")):
        print(
            f"  one page, {label:16s} p50 {statistics.median(pages_ms[paused]):6.1f} ms   "
            f"p99 {percentile(pages_ms[paused], 99):6.1f} ms   longest per pass (median) "
            f"{statistics.median(longest[paused]):.1f} ms"
        )
    ratio = statistics.median(passed) / statistics.median(decoded)
    print(f"  pass / decode (median)   {ratio:.2f}x")


if __name__ == "__main__":
    main()
