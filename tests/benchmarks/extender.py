"""Benchmark: the scheduler extender's filter + prioritize and bind decision, in process.

Usage: ``python tests/benchmarks/extender.py [--quick]``

A cluster of 1,000 nodes × 8 GPUs × 100 units, each GPU 0-100% used in steps
of 10 (seeded; about half the units in use, 1% of GPUs unhealthy), as the
extender's ledger holds it after the node agents reported. Measured, in the
process, on parsed requests (the HTTP decode is measured apart):

* **filter + prioritize**, the two calls kube-scheduler makes for one pod,
  over the node names it sends: all 1,000 (``percentageOfNodesToScore: 100``)
  and 420 (what kube-scheduler's adaptive default, 50% − nodes/125, sends at
  1,000 nodes). Two workloads:

  - *repeated ask*: every pod asks what the previous one did (the pods of one
    Deployment or Job), and one node's ledger changes between pods (the last
    bind). The placement memo answers unchanged nodes;
  - *same sizes, another workload*: every pod asks one of six common sizes
    under container names no pod had (another Deployment): answers are shared
    by size, names put back;
  - *new ask*: every pod asks a number of units no pod asked before, so no
    answer computed for an earlier pod can be reused.

  These pods ask for GPUs in one container, as most do. More figures, in a
  phase of their own, measure pods with GPUs in several containers: an init
  container's share reused by the app (the kubelet's reuse; a closed form of
  its own), a repeated and a new ask; a native sidecar keeping its own units
  beside the app, a new ask (a closed form too); an init container of 1.5 GPUs
  reused by the app, a new ask (the same closed form); a sidecar, an init
  container of 1.5 GPUs and the app, a new ask (the sidecar's share, then that
  closed form); two init containers, the second reusing the first's units, then
  the app, a new ask (the chain's closed form); and an init container of 1.5 GPUs
  whose units the app takes, then a second app container of 30 units, a new ask
  (a shape no closed form covers: the kubelet's replay over the arrays).
  The extender decides every pod over all nodes at once
  (``plugin.extender.bulk``, numpy); ``--node-by-node`` measures the same
  workloads placed one node at a time with place_pod and its memo (the path
  before, kept for clusters the arrays are not built for).

* **bind decision**: place_pod on one node plus the reservation (no API call).

* baseline, same run: the check kube-scheduler's own NodeResourcesFit makes
  per node for this resource (free units in total >= the pod's), in Python
  over the same ledger, so the figures can be read against "the least any
  filter costs here".

Targets (issue 14): filter + prioritize p99 < 5 ms at 1,000 nodes × 8 GPUs;
bind decision p99 < 1 ms.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from plugin.api.scheduling import GpuHolder, GpuLedgerEntry, NodeLedger
from plugin.extender.ledger import NodeView
from plugin.extender.protocol import ExtenderArgs, parse_args
from plugin.extender.service import ExtenderCore
from tests.benchmarks._stats import block_p99, percentile

RESOURCE = "cnvrg.io/metagpu"
NODES, GPUS, UNITS = 1000, 8, 100
SAMPLED = 420
"""kube-scheduler's numFeasibleNodesToFind at 1,000 nodes: max(100, 1000 × (50 − 1000/125)%)."""
FILTER_TARGET_MS, BIND_TARGET_MS = 5.0, 1.0


NEW_MULTI_CONTAINER: tuple[tuple[str, str, int, dict[str, int]], ...] = (
    ("init + app, new ask", "t", 0, {"init_units": 5}),
    ("sidecar + app, new ask", "s", 0, {"sidecar_units": 10}),
    ("init of 1.5 GPUs + app, new ask", "r", 150, {"init_units": 150}),
    (
        "sidecar + init of 1.5 GPUs + app, new ask",
        "x",
        150,
        {"init_units": 150, "sidecar_units": 10},
    ),
    ("two init containers + app, new ask", "y", 150, {"init_units": 150, "setup_units": 30}),
    ("init + two apps (replay), new", "z", 150, {"init_units": 150, "helper_units": 30}),
)
"""The pods with GPUs in several containers that ask what no pod asked before: (figure,
name prefix, units added to the new ask, :func:`pod` keywords), measured in this order."""


def node_ledger(rnd: random.Random, name: str) -> str:
    gpus = []
    for i in range(GPUS):
        used = rnd.choice(range(0, UNITS + 1, 10))
        holders = (
            (GpuHolder(pod_uid=f"{name}-{i}", namespace="ns", pod="p", container="c", units=used),)
            if used
            else ()
        )
        gpus.append(
            GpuLedgerEntry(
                uuid=f"GPU-{name}-{i}",
                index=i,
                units=UNITS,
                healthy=rnd.random() > 0.01,
                numa=i * 2 // GPUS,
                holders=holders,
            )
        )
    return NodeLedger(resource=RESOURCE, units_per_gpu=UNITS, gpus=tuple(gpus)).model_dump_json()


def cluster(
    seed: int = 14, *, node_by_node: bool = False
) -> tuple[ExtenderCore, list[str], random.Random]:
    rnd = random.Random(seed)
    core = ExtenderCore(resource=RESOURCE, bulk=not node_by_node)
    names = [f"node-{n:04d}" for n in range(NODES)]
    for name in names:
        core.ledger.set_node(name, node_ledger(rnd, name))
    core.warm()  # as the extender does once the first list is in
    return core, names, rnd


def container(name: str, units: int) -> dict[str, object]:
    return {
        "name": name,
        "image": "busybox",
        "resources": {"limits": {RESOURCE: str(units)}, "requests": {RESOURCE: str(units)}},
    }


def pod(
    units: int,
    *,
    name: str,
    uid: str,
    init_units: int = 0,
    sidecar_units: int = 0,
    setup_units: int = 0,
    helper_units: int = 0,
) -> dict[str, object]:
    """One container of ``units``; with ``init_units``, an init container before it
    whose share the app container reuses; with ``sidecar_units``, a native sidecar
    (an init container that keeps running, and keeps its own units) declared first;
    with ``setup_units``, one more init container before the other (its units are
    reused by the next init container); with ``helper_units``, a second app container
    after the first (which took the init container's units)."""
    apps = [container(name, units)]
    if helper_units:
        apps.append(container(f"{name}-helper", helper_units))
    spec: dict[str, object] = {"schedulerName": "metagpu-scheduler", "containers": apps}
    before: list[dict[str, object]] = []
    if sidecar_units:  # declared first: it starts before the init container runs
        before.append({**container(f"{name}-proxy", sidecar_units), "restartPolicy": "Always"})
    if setup_units:
        before.append(container(f"{name}-setup", setup_units))
    if init_units:
        before.append(container(f"{name}-init", init_units))
    if before:
        spec["initContainers"] = before
    return {"metadata": {"name": name, "namespace": "bench", "uid": uid}, "spec": spec}


def decide_ms(core: ExtenderCore, the_pod: dict[str, object], names: list[str]) -> float:
    """Filter then prioritize for one pod, as kube-scheduler calls them: milliseconds."""
    args = ExtenderArgs(Pod=the_pod, NodeNames=names)
    start = time.perf_counter()
    core.filter(args)
    core.prioritize(args)
    return (time.perf_counter() - start) * 1000


def baseline_fit(core: ExtenderCore, names: list[str], units: int) -> list[str]:
    """NodeResourcesFit's arithmetic for one resource, over the same ledger."""
    fits = []
    for name in names:
        view = core.ledger.view(name)
        if isinstance(view, NodeView) and sum(g.free for g in view.gpus if g.healthy) >= units:
            fits.append(name)
    return fits


class GcPauses:
    """The collector's full (generation 2) passes while a phase ran: how many, the longest."""

    def __init__(self) -> None:
        self._started = 0.0
        self._lengths: list[float] = []

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._lengths.append((time.perf_counter() - self._started) * 1000)

    def take(self) -> str:
        lengths, self._lengths = self._lengths, []
        if not lengths:
            return "none"
        return f"{len(lengths)}, longest {max(lengths):.1f} ms"


def row(label: str, samples: list[float], target: float | None = None) -> str:
    """p50, pooled p99 and, with enough samples, the median of the blocks' p99s
    (:func:`tests.benchmarks._stats.block_p99`), which a target is judged on: a
    neighbour's burst on this shared VM lands in one block, a real tail in all."""
    p50, p99 = statistics.median(samples), percentile(samples, 99)
    text = f"  {label:<46} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms"
    judged = p99
    blocks = len(samples) // 100
    if blocks >= 3:
        judged, low, high = block_p99(samples, blocks)
        text += f"  block p99 {judged:7.3f} [{low:.3f}-{high:.3f}] ms"
    if target is not None:
        text += f"  target < {target:g} ms: {'met' if judged < target else 'MISSED'}"
    return text


def measure(quick: bool, *, node_by_node: bool = False) -> int:
    rounds = 30 if quick else 300
    two_every = 3 if node_by_node else 1  # node by node they cost 10-100x more
    core, names, rnd = cluster(node_by_node=node_by_node)
    # The cluster lives as long as the process, as the extender's cache does; the
    # collector's full passes over it are not what is measured (the extender's CLI
    # freezes the start-up heap the same way).
    gc.collect()
    gc.freeze()
    sizes = [20, 30, 50, 70, 90, 150]
    pauses = GcPauses()
    gc.callbacks.append(pauses.callback)
    print(
        f"extender benchmark ({'quick' if quick else 'full'}: {rounds} pods per figure; "
        f"{'node by node' if node_by_node else 'every node at once'}; "
        f"{NODES} nodes x {GPUS} GPUs x {UNITS} units)"
    )
    for count in (NODES, SAMPLED):
        candidates = names[:count]
        core.forget_answers()  # nothing carried over from the other size
        print(f"filter + prioritize over {count} node names:")
        base: list[float] = []
        repeated: list[float] = []
        renamed: list[float] = []
        fresh: list[float] = []
        two_repeated: list[float] = []
        multi: dict[str, list[float]] = {label: [] for label, *_ in NEW_MULTI_CONTAINER}
        for k in range(rounds):
            units = sizes[k % len(sizes)]
            # one node changed since the last pod (the last bind's node reported)
            changed = rnd.choice(names)
            core.ledger.set_node(changed, node_ledger(rnd, changed))
            start = time.perf_counter()
            baseline_fit(core, candidates, units)
            base.append((time.perf_counter() - start) * 1000)
            repeated.append(decide_ms(core, pod(70, name="worker", uid=f"r{k}"), candidates))
            other = f"deploy{count}-{k}"  # a common size, names no pod had
            renamed.append(decide_ms(core, pod(units, name=other, uid=other), candidates))
            fresh_name = f"job{count}-{k}"
            # units no pod asked for before (1..rounds, never a common size above)
            fresh_units = 1 + k if 1 + k not in [*sizes, 70] else 1000 + k
            fresh.append(
                decide_ms(core, pod(fresh_units, name=fresh_name, uid=fresh_name), candidates)
            )
        one_gc = pauses.take()
        # Pods with GPUs in several containers, in a phase of their own (node by node,
        # their memo grows the heap, and the collector's passes over it land on
        # whichever request runs then: counted below for each phase).
        for k in range(0, rounds, two_every):
            changed = rnd.choice(names)
            core.ledger.set_node(changed, node_ledger(rnd, changed))
            two_repeated.append(
                decide_ms(
                    core, pod(70, name="tuned", uid=f"t{count}-{k}", init_units=20), candidates
                )
            )
            fresh_units = 1 + k if 1 + k not in [*sizes, 70] else 1000 + k
            for label, prefix, extra, shape in NEW_MULTI_CONTAINER:
                the_pod = pod(
                    extra + fresh_units,
                    name=f"{prefix}job{count}-{k}",
                    uid=f"{prefix}j{count}-{k}",
                    **shape,
                )
                multi[label].append(decide_ms(core, the_pod, candidates))
        two_gc = pauses.take()
        print(row("baseline: total-free check per node", base))
        print(row("repeated ask (one node changed per pod)", repeated, FILTER_TARGET_MS))
        print(row("same sizes, another workload", renamed, FILTER_TARGET_MS))
        print(row("new ask (no earlier answer to reuse)", fresh, FILTER_TARGET_MS))
        print(row("init + app, repeated ask", two_repeated, FILTER_TARGET_MS))
        for label, samples in multi.items():
            print(row(label, samples, FILTER_TARGET_MS))
        print(f"  full GC passes: one-container phase {one_gc}; two-container phase {two_gc}")
        b = statistics.median(base)
        print(
            f"  ratios to the baseline (p50): repeated {statistics.median(repeated) / b:.1f}x, "
            f"another workload {statistics.median(renamed) / b:.1f}x, "
            f"new {statistics.median(fresh) / b:.1f}x"
        )
    body = json.dumps({"Pod": pod(70, name="worker", uid="decode"), "NodeNames": names}).encode()
    decode = []
    for _ in range(rounds):
        start = time.perf_counter()
        parse_args(json.loads(body))
        decode.append((time.perf_counter() - start) * 1000)
    print(f"request decode ({len(body)} bytes, 1,000 names):")
    print(row("json.loads + ExtenderArgs", decode))
    binds = []
    ask_sizes = [20, 50, 70, 150]
    for k in range(rounds * 5):
        the_pod = pod(ask_sizes[k % len(ask_sizes)], name=f"b{k % 7}", uid=f"b{k}")
        ask = core.ask_of(the_pod)
        node = rnd.choice(names)
        start = time.perf_counter()
        decision = core.decide_bind(
            ask, node=node, pod_uid=f"b{k}", namespace="bench", pod="p", now=0.0
        )
        binds.append((time.perf_counter() - start) * 1000)
        if not isinstance(decision, str):
            core.ledger.forget(f"b{k}")
    print("bind decision (place_pod on one node + the reservation, no API call):")
    print(row("decide_bind", binds, BIND_TARGET_MS))
    print(f"placement memo: {core.memo.hits} hits, {core.memo.misses} misses")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds; finishes in seconds")
    parser.add_argument(
        "--node-by-node",
        action="store_true",
        help="place one node at a time (place_pod + memo), the path before, for comparison",
    )
    args = parser.parse_args()
    return measure(args.quick, node_by_node=args.node_by_node)


if __name__ == "__main__":
    raise SystemExit(main())
