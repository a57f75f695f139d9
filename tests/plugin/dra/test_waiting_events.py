"""The Event that says why a DRA pod waits, written through the in-test API server
(plugin.dra.waiting_events), for the captured pod p70 beside two 60-unit shares."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from certs.kube import open_api_client
from plugin.dra.waiting_events import PendingExplainer
from tests.harness.kube_api import FakeKubeApi
from tests.plugin.dra.fixtures import DRIVER, load

NOW = dt.datetime(2026, 11, 27, 6, 27, 17, tzinfo=dt.UTC)


def put_captured_state(fake: FakeKubeApi) -> dict[str, Any]:
    """The node's slice, the two allocated 60s, and pending p70 with its claim."""
    fake.put(load("resourceslice-consumable-accepted.json")["response"]["body"])
    for name in ("claim-60-units-a-allocated.json", "claim-60-units-b-allocated.json"):
        fake.put(load(name))
    pending = load("event-70-units-unschedulable.json")
    fake.put(pending["claim"])
    pod: dict[str, Any] = fake.put(pending["pod"])
    return pod


async def test_a_pending_pod_gets_one_event_saying_why(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    fake, _ = kube_api
    pod = put_captured_state(fake)
    async with open_api_client() as (api, _):
        explainer = PendingExplainer(
            api, driver=DRIVER, device_class=DRIVER, reporting_instance="test", clock=lambda: NOW
        )
        assert await explainer.explain_once() == 1
        (event,) = fake.objects("events.k8s.io/v1", "Event", "dra-cap")
        assert event["reason"] == "NoGpuShareFits"
        assert event["type"] == "Warning"
        assert event["reportingController"] == "gpu.metagpu.io/why-pending"
        assert event["regarding"]["uid"] == pod["metadata"]["uid"]
        assert event["note"] == (
            "claim p70-gpu-nd7kc: localhost: no single GPU has 70 free units (largest 40; "
            "80 free in total) (free: gpu-0 40 units, 79Gi; gpu-1 40 units, 79Gi)"
        )
        # the same reason next pass: not repeated
        assert await explainer.explain_once() == 0
        assert len(fake.objects("events.k8s.io/v1", "Event", "dra-cap")) == 1


async def test_nothing_is_said_when_a_gpu_has_room_or_nothing_waits(
    kube_api: tuple[FakeKubeApi, str], kube_config_env: Path
) -> None:
    fake, _ = kube_api
    async with open_api_client() as (api, _):
        explainer = PendingExplainer(
            api, driver=DRIVER, device_class=DRIVER, reporting_instance="test", clock=lambda: NOW
        )
        assert await explainer.explain_once() == 0  # no pods at all
        fake.put(load("resourceslice-consumable-accepted.json")["response"]["body"])
        fake.put(load("claim-60-units-b-allocated.json"))  # gpu-0 is free: the 70 fits
        pending = load("event-70-units-unschedulable.json")
        fake.put(pending["claim"])
        fake.put(pending["pod"])
        assert await explainer.explain_once() == 0
        assert fake.objects("events.k8s.io/v1", "Event", "dra-cap") == []
