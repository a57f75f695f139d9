"""Preemption decision at 1,000 nodes × 8 GPUs, beside the filter call of the same run.

Every GPU holds two or three low-priority pods of 20-40 units (priorities 0 and 100), so a
pod of 70 units fits no single GPU anywhere while most nodes have 70 units free in total:
the case kube-scheduler's own dry run cannot see. A pod of priority 1000 then asks:

* **preempt verb**: ``ExtenderCore.preempt`` with 100 candidate nodes, what kube-scheduler
  sends at 1,000 nodes (DefaultPreemption: max(100, 10%) candidates), each with two
  offered victims;
* **own search**: the filter path's search over all 1,000 refused nodes
  (``search_nodes``: stops after max(100, 10%) nodes with a plan, picks one);
* **own search, no lower priority**: the same search for a pod of priority 0, which may
  preempt no one (every pod here is at 0 or 100): what every unschedulable pod of a
  one-priority cluster costs after its filter;
* **filter (baseline)**: the filter call for the same pod on the same ledger, the call
  every pending pod makes anyway.

"warm": the placement memo kept between calls, as in a running extender (the pods of a
workload ask alike); "cold": the memo dropped before each call (a pod shape never seen).
Run: ``.venv/bin/python -m tests.benchmarks.preemption [--quick]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from plugin.api.scheduling import GpuHolder, GpuLedgerEntry, NodeLedger
from plugin.extender.podfacts import PodFacts
from plugin.extender.preemption import candidates_wanted, search_nodes
from plugin.extender.protocol import ExtenderArgs, ExtenderPreemptionArgs
from plugin.extender.service import ExtenderCore
from tests.benchmarks._stats import percentile, timed_ms

RESOURCE = "cnvrg.io/metagpu"
NODES = 1000
GPUS = 8


def build(rnd: random.Random) -> tuple[ExtenderCore, list[str], dict[str, list[str]]]:
    core = ExtenderCore(resource=RESOURCE)
    names = [f"node-{i:04d}" for i in range(NODES)]
    holders_of: dict[str, list[str]] = {}
    for name in names:
        gpus = []
        uids: list[str] = []
        for g in range(GPUS):
            held = []
            used = 0
            for k in range(rnd.choice((2, 3))):
                units = rnd.randint(20, 40)
                if used + units > 100:
                    break
                used += units
                uid = f"{name}-{g}-{k}"
                uids.append(uid)
                held.append(
                    GpuHolder(pod_uid=uid, namespace="ml", pod=uid, container="c", units=units)
                )
                core.directory.put(
                    PodFacts(
                        uid,
                        "ml",
                        uid,
                        rnd.choice((0, 100)),
                        True,
                        {"app": f"a{k}"},
                        f"2024-01-01T00:{rnd.randint(0, 59):02d}:00Z",
                    )
                )
            if 100 - used >= 70:  # keep every GPU below 70 free: no pod of 70 fits as is
                extra = 100 - used - 60
                uid = f"{name}-{g}-x"
                uids.append(uid)
                held.append(
                    GpuHolder(pod_uid=uid, namespace="ml", pod=uid, container="c", units=extra)
                )
                core.directory.put(PodFacts(uid, "ml", uid, 0, True, {}, ""))
            gpus.append(
                GpuLedgerEntry(uuid=f"GPU-{name}-{g}", index=g, units=100, holders=tuple(held))
            )
        holders_of[name] = uids
        core.ledger.set_node(
            name,
            NodeLedger(resource=RESOURCE, units_per_gpu=100, gpus=tuple(gpus)).model_dump_json(),
        )
    core.warm()
    return core, names, holders_of


def the_pod() -> dict[str, Any]:
    res = {"limits": {RESOURCE: "70"}, "requests": {RESOURCE: "70"}}
    return {
        "metadata": {"name": "high", "namespace": "ml", "uid": "uid-high"},
        "spec": {
            "priority": 1000,
            "containers": [{"name": "main", "image": "x", "resources": res}],
        },
    }


def row(label: str, samples: list[float], base: list[float]) -> str:
    p50, p99 = statistics.median(samples), percentile(samples, 99)
    b50, b99 = statistics.median(base), percentile(base, 99)
    return (
        f"  {label:<34} p50 {p50:8.2f} ms  p99 {p99:8.2f} ms   "
        f"÷ filter p50 {p50 / b50:5.1f}×  p99 {p99 / b99:5.1f}×"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    rounds = 20 if args.quick else 200
    cold_rounds = 5 if args.quick else 50
    core, names, holders_of = build(random.Random(27))
    pod = the_pod()
    filter_args = ExtenderArgs(Pod=pod, NodeNames=names)
    offered = names[: candidates_wanted(NODES)]
    preempt_args = ExtenderPreemptionArgs.model_validate(
        {
            "Pod": pod,
            "NodeNameToMetaVictims": {
                n: {"Pods": [{"UID": u} for u in holders_of[n][:2]], "NumPDBViolations": 0}
                for n in offered
            },
        }
    )
    result = core.filter(filter_args)
    assert not result["NodeNames"], "the benchmark's pod must fit no GPU as the cluster is"
    from plugin.extender.podfacts import pod_facts

    preemptor = pod_facts(pod)
    ask = core.ask_of(pod)

    def search_as(facts: PodFacts, *, expect_plan: bool) -> Callable[[], object]:
        def search() -> object:
            found = search_nodes(
                ask,
                facts,
                names,
                ledger=core.ledger,
                directory=core.directory,
                budgets=core.budgets.in_namespaces,
                memo=core.memo,
                wanted=candidates_wanted(NODES),
            )
            assert (found.plan is not None) == expect_plan
            return found

        return search

    search = search_as(preemptor, expect_plan=True)
    # the benchmark's pods are at 0 and 100: a pod at 0 may preempt no one
    search_no_victims = search_as(replace(preemptor, priority=0), expect_plan=False)

    def verb() -> object:
        answer = core.preempt(preempt_args, now=0.0)
        assert len(answer["NodeNameToMetaVictims"]) == len(offered)
        return answer

    def cold(fn: Any) -> Any:
        def run() -> object:
            core.forget_answers()
            return fn()

        return run

    print(f"preemption decision, {NODES} nodes × {GPUS} GPUs, a pod of 70 units at priority 1000")
    base_warm = timed_ms(lambda: core.filter(filter_args), rounds)
    print(row("filter (baseline), warm", base_warm, base_warm))
    print(row("preempt verb, 100 nodes, warm", timed_ms(verb, rounds), base_warm))
    print(row("own search, 1,000 nodes, warm", timed_ms(search, rounds), base_warm))
    print(
        row(
            "own search, no lower priority, warm",
            timed_ms(search_no_victims, rounds),
            base_warm,
        )
    )
    base_cold = timed_ms(cold(lambda: core.filter(filter_args)), cold_rounds)
    print(row("filter (baseline), cold", base_cold, base_cold))
    print(row("preempt verb, 100 nodes, cold", timed_ms(cold(verb), cold_rounds), base_cold))
    print(row("own search, 1,000 nodes, cold", timed_ms(cold(search), cold_rounds), base_cold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
