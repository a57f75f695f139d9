"""On an MPS node, the extender's assignments keep each GPU to one user's MPS clients, and the
device plugin hands out exactly those GPUs through the kubelet's real protocol (issue 28).

The extender decides each bind on the node's ledger (a node a supervised MPS daemon serves)
with its own earlier binds as assumptions, and learns each bound pod's user as its pod watch
would; the plugin's assignment book gets each pod's annotation; the simulated kubelet admits
the pods over real gRPC (GetPreferredAllocation, Allocate). No GPU ever holds containers of
two users, and the pod that could only wait for another user's clients is refused, with why.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from plugin.api.scheduling import GpuLedgerEntry, NodeLedger
from plugin.extender.podfacts import PodFacts
from plugin.extender.service import ExtenderCore
from tests.plugin.builders import uuid_for
from tests.plugin.conftest import kubelet_and_plugin
from tests.plugin.deviceplugin.assignment_builders import assigned_pod

R = "cnvrg.io/metagpu"
GPUS = [uuid_for(0), uuid_for(1)]


def counts(ids: list[str]) -> dict[str, int]:
    return dict(Counter(i.rsplit("::", 1)[0] for i in ids))


async def test_each_gpu_serves_one_user_from_bind_to_allocate(short_tmp_path: Path) -> None:
    core = ExtenderCore(resource=R)
    mps_ledger = NodeLedger(
        resource=R,
        units_per_gpu=100,
        gpus=tuple(GpuLedgerEntry(uuid=g, index=i, units=100) for i, g in enumerate(GPUS)),
        enforces=("memory",),
    )
    core.ledger.set_node("node-a", mps_ledger.model_dump_json())
    users_on: dict[str, set[int]] = {g: set() for g in GPUS}
    refused: list[str] = []
    async with kubelet_and_plugin(short_tmp_path, gpu_count=2) as (kubelet, plugin):
        await kubelet.wait_registered(R)
        book = plugin.supervisor.book
        for n, user in enumerate([1000, 2000, 1000, 2000, 3000]):
            name = f"p{n}"
            spec = {
                "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
                "spec": {
                    "securityContext": {"runAsUser": user},
                    "containers": [
                        {
                            "name": "main",
                            "resources": {"limits": {R: "30"}, "requests": {R: "30"}},
                        }
                    ],
                },
            }
            ask = core.ask_of(spec)
            decision = core.decide_bind(
                ask, node="node-a", pod_uid=f"uid-{name}", namespace="ml", pod=name, now=0.0
            )
            if isinstance(decision, str):
                refused.append(decision)
                continue
            # the extender's pod watch sees the bound pod (and so its user)
            core.directory.put(PodFacts(f"uid-{name}", "ml", name, 0, True, user=user))
            gpus = dict(decision.assignment.containers[0].gpus)
            book.apply(
                "ADDED",
                assigned_pod(name, [("main", "app", 30, gpus)], created=f"2026-11-27T10:00:0{n}Z"),
            )
            admitted = await kubelet.admit_pod(R, [("main", "app", 30)])
            ((_, ids, _),) = admitted
            assert counts(ids) == gpus, name  # the plugin followed the assignment
            for gpu in gpus:
                users_on[gpu].add(user)
    assert users_on == {GPUS[0]: {1000}, GPUS[1]: {2000}}
    assert len(refused) == 1
    assert "serve other users' MPS clients" in refused[0]
    assert "this pod runs as UID 3000" in refused[0]
