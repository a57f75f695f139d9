"""The Node label writer against the protocol-faithful fake API server: merge patches
only, never a read of the Node, and stale labels of an earlier run still removed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from certs.kube import open_api_client
from plugin.agent.kube import NodeLabeler
from plugin.agent.labels import OWNED_LABELS, full_label_patch
from plugin.api.resources import (
    NODE_LABEL_ENFORCES,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_MEMORY_MIB,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_LARGEST_FREE_UNITS,
    NODE_LABEL_UNITS_PER_GPU,
)
from tests.harness.kube_api import FakeKubeApi

NO_GPUS = {
    NODE_LABEL_GPU_COUNT: "0",
    NODE_LABEL_UNITS_PER_GPU: "100",
    NODE_LABEL_LARGEST_FREE_UNITS: "0",
}


@pytest.fixture
async def api(kube_config_env: Path) -> AsyncIterator[client.ApiClient]:
    async with open_api_client() as (api, _source):
        yield api


def node_labels(fake: FakeKubeApi) -> dict[str, str]:
    node = fake.get("v1", "Node", "node-a")
    assert node is not None
    return dict(node["metadata"].get("labels") or {})


def put_node(fake: FakeKubeApi, labels: dict[str, str]) -> None:
    node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node"}
    node["metadata"] = {"name": "node-a", "labels": labels}
    fake.put(node)


def test_full_label_patch_names_every_owned_label() -> None:
    assert full_label_patch(NO_GPUS) == {
        NODE_LABEL_GPU_PRODUCT: None,
        NODE_LABEL_GPU_COUNT: "0",
        NODE_LABEL_GPU_MEMORY_MIB: None,
        NODE_LABEL_UNITS_PER_GPU: "100",
        NODE_LABEL_LARGEST_FREE_UNITS: "0",
        NODE_LABEL_ENFORCES: None,
    }
    assert set(full_label_patch({})) == set(OWNED_LABELS)


async def test_labels_of_an_earlier_run_are_removed_without_reading_the_node(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient
) -> None:
    fake, _ = kube_api
    put_node(
        fake,
        {
            "kubernetes.io/hostname": "node-a",
            NODE_LABEL_GPU_PRODUCT: "Tesla-T4",  # the GPUs were taken out since
            NODE_LABEL_GPU_MEMORY_MIB: "15360",
            NODE_LABEL_GPU_COUNT: "4",
        },
    )
    labeler = NodeLabeler(api, "node-a")
    assert await labeler.sync(NO_GPUS)
    assert node_labels(fake) == {"kubernetes.io/hostname": "node-a", **NO_GPUS}
    assert not await labeler.sync(NO_GPUS)  # nothing changed: nothing sent
    assert await labeler.sync({**NO_GPUS, NODE_LABEL_LARGEST_FREE_UNITS: "40"})
    assert node_labels(fake)[NODE_LABEL_LARGEST_FREE_UNITS] == "40"
    patches = [r for r in fake.requests if r.resource == "nodes"]
    assert [r.verb for r in patches] == ["patch", "patch"]
    assert fake.verbs_used() == {("", "nodes", "patch")}


async def test_after_a_failed_write_every_label_is_written_again(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient
) -> None:
    fake, _ = kube_api
    put_node(fake, {})
    labeler = NodeLabeler(api, "node-a")
    assert await labeler.sync(NO_GPUS)
    # Someone removes a label; then a write fails, so the labeler no longer trusts
    # what it last wrote.
    put_node(fake, {k: v for k, v in NO_GPUS.items() if k != NODE_LABEL_GPU_COUNT})
    fake.fail_next("patch", "nodes", status=500, reason="InternalError", message="etcd")
    changed = {**NO_GPUS, NODE_LABEL_LARGEST_FREE_UNITS: "10"}
    assert not await labeler.sync(changed)
    assert await labeler.sync(changed)
    assert node_labels(fake) == changed  # the removed label is back too
