"""What a node enforces, from the device plugin's board to the extender's refusal (issue 28).

The plugin's board (written as :class:`~plugin.gpu.health_file.BoardPublisher` writes it,
stamped by this running process) says the plugin supervises the MPS daemon; the agent,
as ``metagpu agent`` runs it (real API client against the fake API server, PodResources
over gRPC), labels the node ``metagpu.io/enforces`` and writes ``enforces`` into its
ledger; the scheduler extender, fed that very annotation, takes a ``fixed`` pod there and
refuses it, with its reason, once the plugin stops supervising. Every wait is on a
condition, bounded.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from certs.kube import open_api_client
from plugin.agent import pods as pods_module
from plugin.agent.agent import AgentRuntime
from plugin.agent.gpus import NoDriver
from plugin.api.config import PluginConfig
from plugin.api.provenance import Stamp, current_writer
from plugin.api.resources import NODE_LABEL_ENFORCES
from plugin.api.scheduling import ANNOTATION_GPU_LEDGER
from plugin.extender.decision import FIXED_NEEDS_CAP
from plugin.extender.protocol import parse_args
from plugin.extender.service import ExtenderCore
from plugin.gpu.health import GpuHealth
from plugin.gpu.health_file import HEALTH_FILE_NAME, board_document, write_board
from plugin.gpu.mps import MpsNode, MpsStatus
from tests.agent.builders import mirror_this_process
from tests.agent.helpers import eventually
from tests.extender.builders import pod
from tests.harness.kube_api import FakeKubeApi
from tests.harness.podresources import running_pod_resources
from tests.plugin.builders import gpu

NODE = "node-a"


def publish(directory: Path, mps: MpsNode) -> None:
    """The running plugin's board: two healthy GPUs and its MPS."""
    infos = {g.uuid: g for g in (gpu(0), gpu(1))}
    records = {u: GpuHealth(uuid=u, state="Healthy", reason="", check="", since=0.0) for u in infos}
    stamp = Stamp(writer=current_writer(), written_at=time.time(), valid_for_s=30.0)
    write_board(
        directory / HEALTH_FILE_NAME,
        board_document(infos, records, {}, written_at=stamp.written_at, stamp=stamp, mps=mps),
    )


@pytest.fixture
def api(kube_api: tuple[FakeKubeApi, str], kube_config_env: Path, monkeypatch: Any) -> FakeKubeApi:
    monkeypatch.setattr(pods_module, "WATCH_TIMEOUT_S", 1)
    fake, _ = kube_api
    fake.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}})
    return fake


def node(fake: FakeKubeApi) -> dict[str, Any]:
    obj = fake.get("v1", "Node", NODE)
    assert obj is not None
    return obj


def label(fake: FakeKubeApi) -> str | None:
    return (node(fake)["metadata"].get("labels") or {}).get(NODE_LABEL_ENFORCES)


def ledger(fake: FakeKubeApi) -> str | None:
    annotation: str | None = (node(fake)["metadata"].get("annotations") or {}).get(
        ANNOTATION_GPU_LEDGER
    )
    return annotation


def filter_fixed(annotation: str | None) -> dict[str, Any]:
    core = ExtenderCore(resource="cnvrg.io/metagpu")
    core.ledger.set_node(NODE, annotation)
    fixed = pod(50, annotations={"metagpu.io/compute-policy": "fixed"})
    result: dict[str, Any] = dict(core.filter(parse_args({"Pod": fixed, "NodeNames": [NODE]})))
    return result


async def test_the_node_says_what_it_enforces_and_the_extender_follows(
    short_tmp_path: Path, tmp_path: Path, api: FakeKubeApi
) -> None:
    proc = tmp_path / "proc"
    mirror_this_process(proc)
    directory = short_tmp_path / "dp"
    directory.mkdir()
    publish(directory, MpsNode(mode="supervised", status=MpsStatus(state="up")))
    config = PluginConfig.model_validate(
        {
            "device_plugins_dir": str(directory),
            "agent": {
                "node_name": NODE,
                "socket_dir": str(short_tmp_path / "run"),
                "pod_resources_socket": str(short_tmp_path / "pr.sock"),
                "metrics_listen": "127.0.0.1:0",
                "proc_root": str(proc),
                "interval_s": 0.1,
            },
        }
    )
    async with (
        running_pod_resources(short_tmp_path / "pr.sock"),
        AgentRuntime(config, open_api=open_api_client, backend=NoDriver("no driver here")) as rt,
    ):
        await eventually(lambda: label(api) == "memory.fixed", what="the node says memory.fixed")
        await eventually(
            lambda: '"enforces":["memory","fixed"]' in (ledger(api) or ""),
            what="the ledger says memory and fixed",
        )
        assert len(json.loads(ledger(api) or "{}")["gpus"]) == 2
        result = filter_fixed(ledger(api))
        assert result["NodeNames"] == [NODE]

        # The daemon down: its GPUs take no new container, so nothing is admitted
        # unlimited and the node still says what it holds containers to.
        publish(
            directory,
            MpsNode(mode="supervised", status=MpsStatus(state="down", reason="gone", restarts=1)),
        )
        await rt.agent.next_cycle()
        snapshot = (await rt.agent.next_cycle()).snapshot  # a whole cycle after the write
        assert snapshot.mps.status is not None
        assert snapshot.mps.status.state == "down"
        assert label(api) == "memory.fixed"
        # The plugin restarted without supervision (someone else's daemon, or none).
        publish(directory, MpsNode(mode="unsupervised"))
        await eventually(lambda: label(api) == "", what="the node says it enforces nothing")
        await eventually(
            lambda: "enforces" not in (ledger(api) or "enforces"),
            what="the ledger drops enforces",
        )
        result = filter_fixed(ledger(api))
        assert result["NodeNames"] == []
        assert result["FailedAndUnresolvableNodes"] == {NODE: FIXED_NEEDS_CAP}
