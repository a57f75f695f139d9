"""The slice publisher against the in-test API server, without gRPC or GPUs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from certs.kube import open_api_client
from plugin.dra.kube import SlicePublisher
from plugin.dra.slices import SliceError, SlicePlan, build_slice
from tests.harness.kube_api import FakeKubeApi
from tests.plugin.dra.fixtures import CAPTURED_GPUS, DRIVER, NODE, dra_config, load

SLICE = f"{NODE}-{DRIVER}"


@pytest.fixture
async def api(kube_config_env: Path) -> AsyncIterator[client.ApiClient]:
    async with open_api_client() as (api, _source):
        yield api


async def test_publish_creates_then_leaves_an_equal_slice_alone(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient, tmp_path: Path
) -> None:
    fake, _ = kube_api
    config = dra_config(tmp_path)

    def plan(generation: int) -> SlicePlan:
        return build_slice(
            CAPTURED_GPUS, records={}, config=config, node_name=NODE, generation=generation
        )

    publisher = SlicePublisher(api, plan, node_name=NODE, driver=DRIVER, timeout_s=5)
    await publisher.publish_once()
    await publisher.publish_once()
    assert publisher.published == 1
    assert [r.verb for r in fake.writes()] == ["create"]
    stored = fake.get("resource.k8s.io/v1", "ResourceSlice", SLICE)
    assert stored is not None
    assert (
        stored["spec"] == load("resourceslice-consumable-accepted.json")["request"]["body"]["spec"]
    )


async def test_a_changed_slice_is_replaced_with_the_next_generation(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient, tmp_path: Path
) -> None:
    fake, _ = kube_api
    config = dra_config(tmp_path)
    gpus = list(CAPTURED_GPUS)

    def plan(generation: int) -> SlicePlan:
        return build_slice(gpus, records={}, config=config, node_name=NODE, generation=generation)

    publisher = SlicePublisher(api, plan, node_name=NODE, driver=DRIVER, timeout_s=5)
    await publisher.publish_once()
    gpus.pop()
    await publisher.publish_once()
    assert [r.verb for r in fake.writes()] == ["create", "update"]
    stored = fake.get("resource.k8s.io/v1", "ResourceSlice", SLICE)
    assert stored is not None
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0"]
    assert stored["spec"]["pool"]["generation"] == 2


async def test_a_slice_the_api_server_would_refuse_is_not_sent(
    kube_api: tuple[FakeKubeApi, str], api: client.ApiClient, tmp_path: Path
) -> None:
    fake, _ = kube_api
    config = dra_config(tmp_path)

    def plan(generation: int) -> SlicePlan:
        good = build_slice(CAPTURED_GPUS, records={}, config=config, node_name=NODE)
        good.body["spec"]["devices"][0]["allowMultipleAllocations"] = False
        return good

    publisher = SlicePublisher(api, plan, node_name=NODE, driver=DRIVER, timeout_s=5)
    with pytest.raises(SliceError, match="allowMultipleAllocations must be true"):
        await publisher.publish_once()
    assert fake.writes() == []
