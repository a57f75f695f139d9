"""The DRA plugin's pure core against what a real v1.36.2 cluster accepted and did.

Slices: the one we build equals the slice the kube-apiserver stored. Claims: every
captured allocated claim on the consumable slice prepares into the answer the kubelet
got, one CDI spec per share with that share's limits; unprepare removes them.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from plugin.api.quantity import QuantityError, bytes_to_mib, format_mib, parse_quantity
from plugin.dra.cdi import CDI_VERSION, share_limits
from plugin.dra.claims import AllocatedShare, ClaimError, ClaimRef, shares_of
from plugin.dra.config import DraConfig
from plugin.dra.device_health import DeviceHealthEntry, device_health
from plugin.dra.prepare import Preparer
from plugin.dra.slices import MAX_DEVICES_PER_SLICE, SliceError, build_slice, same_devices
from plugin.gpu.health import GpuHealth
from tests.plugin.dra.fixtures import (
    CAPTURED_GPUS,
    DRIVER,
    NODE,
    PREPARE_CALLS,
    claim_from_call,
    claim_object,
    dra_config,
    load,
)

CONSUMABLE_CLAIMS = (
    "claim-p50-a-50-units-40gi-allocated.json",
    "claim-p50-b-50-units-40gi-allocated.json",
    "claim-p50-c-50-units-40gi-allocated.json",
    "claim-10gi-memory-only-allocated.json",
    "claim-1500mi-rounded-allocated.json",
    "claim-no-capacity-request-allocated.json",
    "claim-60-units-a-allocated.json",
    "claim-60-units-b-allocated.json",
    "claim-70-units-allocated-after-release.json",
)


def ref_of(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


# ------------------------------------------------------------------ the slice
def test_slice_equals_the_slice_the_api_server_stored(tmp_path: Path) -> None:
    exchange = load("resourceslice-consumable-accepted.json")
    plan = build_slice(CAPTURED_GPUS, records={}, config=dra_config(tmp_path), node_name=NODE)
    assert plan.body["apiVersion"] == exchange["request"]["body"]["apiVersion"]
    assert plan.body["kind"] == exchange["request"]["body"]["kind"]
    # what was sent and what came back (keys sorted, nothing defaulted) are equal as JSON
    assert plan.body["spec"] == exchange["request"]["body"]["spec"]
    assert plan.body["spec"] == exchange["response"]["body"]["spec"]
    assert plan.devices == {"gpu-0": CAPTURED_GPUS[0].uuid, "gpu-1": CAPTURED_GPUS[1].uuid}
    assert plan.withdrawn == {}
    assert plan.body["metadata"]["name"] == f"{NODE}-{DRIVER}"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param(
            {
                "record": GpuHealth(
                    uuid="", state="Unhealthy", reason="XID 79", check="xid", since=0.0
                )
            },
            "XID 79",
            id="unhealthy-record",
        ),
        pytest.param({"gpu": {"unhealthy_reason": "NVML failed"}}, "NVML failed", id="discovery"),
        pytest.param({"gpu": {"identity_known": False}}, "UUID", id="unknown-identity"),
        pytest.param({"gpu": {"mig_enabled": True}}, "MIG", id="mig"),
    ],
)
def test_a_withdrawn_gpu_leaves_the_slice_with_its_reason(
    tmp_path: Path, change: dict[str, Any], reason: str
) -> None:
    gpu0, gpu1 = CAPTURED_GPUS
    gpu1 = replace(gpu1, **change.get("gpu", {}))
    records = {}
    if "record" in change:
        records[gpu1.uuid] = replace(change["record"], uuid=gpu1.uuid)
    plan = build_slice((gpu0, gpu1), records=records, config=dra_config(tmp_path), node_name=NODE)
    assert [d["name"] for d in plan.body["spec"]["devices"]] == ["gpu-0"]
    assert reason in plan.withdrawn[gpu1.uuid]


def test_request_policies_come_from_config(tmp_path: Path) -> None:
    config = dra_config(
        tmp_path,
        units_per_gpu=1000,
        units={"default": 10, "min": 10, "step": 10},
        memory={"default_mib": 512, "min_mib": 512, "step_mib": 512},
    )
    gpu = replace(CAPTURED_GPUS[0], memory_mib=40536)  # not a whole GiB
    plan = build_slice((gpu,), records={}, config=config, node_name=NODE)
    capacity = plan.body["spec"]["devices"][0]["capacity"]
    assert capacity["units"] == {
        "value": "1000",
        "requestPolicy": {
            "default": "10",
            "validRange": {"min": "10", "max": "1000", "step": "10"},
        },
    }
    assert capacity["memory"] == {
        "value": "40536Mi",
        "requestPolicy": {
            "default": "512Mi",
            "validRange": {"min": "512Mi", "max": "40536Mi", "step": "512Mi"},
        },
    }


def test_more_gpus_than_a_slice_holds_is_an_error(tmp_path: Path) -> None:
    many = [replace(CAPTURED_GPUS[0], index=i, uuid=f"GPU-{i}") for i in range(129)]
    with pytest.raises(SliceError, match=f"exceed the {MAX_DEVICES_PER_SLICE} devices"):
        build_slice(many, records={}, config=dra_config(tmp_path), node_name=NODE)


def test_same_devices_ignores_the_generation(tmp_path: Path) -> None:
    config = dra_config(tmp_path)
    one = build_slice(CAPTURED_GPUS, records={}, config=config, node_name=NODE, generation=1)
    two = build_slice(CAPTURED_GPUS, records={}, config=config, node_name=NODE, generation=7)
    fewer = build_slice(CAPTURED_GPUS[:1], records={}, config=config, node_name=NODE)
    assert same_devices(one.body, two.body)
    assert not same_devices(one.body, fewer.body)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param({"units": {"default": 1, "min": 5}}, "default is less than min", id="units"),
        pytest.param(
            {"memory": {"default_mib": 512, "min_mib": 1024}},
            "default_mib is less than min",
            id="memory",
        ),
        pytest.param({"units": {"min": 101}}, "above units_per_gpu", id="min-over"),
        pytest.param({"driver_name": "GPU_metagpu"}, "DNS subdomain", id="driver"),
        pytest.param({"unknown": 1}, "Extra inputs", id="typo"),
    ],
)
def test_bad_policies_fail_at_start(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DraConfig.model_validate(settings)


# ------------------------------------------------------------------ quantities
@pytest.mark.parametrize(
    ("raw", "mib"),
    [("40Gi", 40960), ("2Gi", 2048), ("1500Mi", 1500), ("1G", 953), (1073741824, 1024)],
)
def test_memory_quantities_floor_to_mib(raw: object, mib: int) -> None:
    assert bytes_to_mib(raw) == mib


@pytest.mark.parametrize("raw", ["", "1.5.0", "10Xi", None, True, "1Gi "])
def test_bad_quantities_are_named(raw: object) -> None:
    with pytest.raises(QuantityError, match="not a quantity"):
        parse_quantity(raw)


def test_the_plugin_reads_every_form_the_api_server_writes() -> None:
    """One parser (plugin.api.quantity) for the webhook and the DRA plugin: exponent
    and milli forms are quantities the API server may canonicalise to."""
    assert parse_quantity("1e3") == 1000
    assert bytes_to_mib("1073741824") == 1024
    assert parse_quantity("500m") * 2 == 1


def test_format_mib_round_trips() -> None:
    for mib in (1024, 81920, 40536, 1):
        assert bytes_to_mib(format_mib(mib)) == mib


# ------------------------------------------------------------------ claims
@pytest.mark.parametrize("name", CONSUMABLE_CLAIMS)
def test_every_captured_consumable_claim_reads_as_one_share(name: str) -> None:
    claim = load(name)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    (share,) = shares_of(claim, ref=ref_of(claim), driver=DRIVER, node_name=NODE)
    assert share == AllocatedShare(
        request=result["request"],
        pool=NODE,
        device=result["device"],
        share_id=result["shareID"],
        units=int(result["consumedCapacity"]["units"]),
        memory_mib=bytes_to_mib(result["consumedCapacity"]["memory"]),
    )


def test_the_meta_device_pool_is_not_ours() -> None:
    """The captured meta-device model (pool ``localhost-units``, 100 devices per GPU) was
    the rejected alternative; a claim from it names its pool in the refusal."""
    claim = load("claim-meta-30-units-matchattribute-allocated.json")
    with pytest.raises(ClaimError, match="localhost-units/gpu-0-unit-00 is not in this node's"):
        shares_of(claim, ref=ref_of(claim), driver=DRIVER, node_name=NODE)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        pytest.param(
            lambda c: c["metadata"].update(uid="other"), "deleted and re-created", id="uid"
        ),
        pytest.param(lambda c: c["status"].pop("allocation"), "is not allocated", id="pending"),
        pytest.param(
            lambda c: c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0][
                "matchFields"
            ][0].update(values=["node-b"]),
            "is allocated to node node-b, not localhost",
            id="other-node",
        ),
        pytest.param(
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
                driver="gpu.nvidia.com"
            ),
            "has no device of driver gpu.metagpu.io",
            id="other-driver",
        ),
        pytest.param(
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool="node-b"),
            "is not in this node's pool localhost",
            id="other-pool",
        ),
        pytest.param(
            lambda c: c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"].update(
                memory="lots"
            ),
            "'lots' is not a quantity",
            id="bad-quantity",
        ),
    ],
)
def test_a_claim_not_for_this_driver_or_node_is_refused_by_name(mutate: Any, message: str) -> None:
    claim = load("claim-p50-a-50-units-40gi-allocated.json")
    mutate(claim)
    ref = ClaimRef(namespace="dra-cap", name="p50-a-gpu-9fv8q", uid=claim["metadata"]["uid"])
    if "deleted" in message:
        ref = replace(ref, uid="c8c5ab1b-e4c2-4651-994b-271b1aab5189")
    with pytest.raises(ClaimError, match=message) as info:
        shares_of(claim, ref=ref, driver=DRIVER, node_name=NODE)
    assert "claim dra-cap/p50-a-gpu-9fv8q" in str(info.value)


# ------------------------------------------------------------------ prepare
def preparer(cdi_dir: Path, **overrides: Any) -> Preparer:
    p = Preparer(config=dra_config(cdi_dir, **overrides), node_name=NODE)
    p.offer(CAPTURED_GPUS, withdrawn={})
    return p


@pytest.mark.parametrize("name", PREPARE_CALLS)
def test_prepare_gives_the_captured_answer(tmp_path: Path, name: str) -> None:
    call = load(name)
    ref, claim = claim_from_call(call)
    (device,) = preparer(tmp_path).prepare(ref, claim)
    (expected,) = call["response"]["claims"][ref.uid]["devices"]
    assert list(device.request_names) == expected["request_names"]
    assert device.pool_name == expected["pool_name"]
    assert device.device_name == expected["device_name"]
    assert device.share_id == expected["share_id"]
    # One CDI device per share (kubernetes/kubernetes#134519), not the recording
    # plugin's one per GPU: two shares of gpu-0 need two names and two limits.
    assert device.cdi_device_ids == (f"{DRIVER}/gpu={expected['share_id']}",)


def read_spec(cdi_dir: Path) -> dict[str, Any]:
    (path,) = cdi_dir.glob("*.json")
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    (device,) = spec["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


@pytest.mark.parametrize(
    ("name", "units", "memory_mib", "percent"),
    [
        pytest.param("claim-p50-a-50-units-40gi-allocated.json", 50, 40960, 50, id="50u-40Gi"),
        pytest.param("claim-10gi-memory-only-allocated.json", 1, 10240, 1, id="10Gi-only"),
        pytest.param("claim-1500mi-rounded-allocated.json", 1, 2048, 1, id="1500Mi-to-2Gi"),
        pytest.param("claim-no-capacity-request-allocated.json", 1, 1024, 1, id="defaults"),
        pytest.param("claim-70-units-allocated-after-release.json", 70, 1024, 70, id="70u"),
    ],
)
def test_the_cdi_spec_carries_the_share_limits(
    tmp_path: Path, name: str, units: int, memory_mib: int, percent: int
) -> None:
    claim = load(name)
    ref = ref_of(claim)
    (device,) = preparer(tmp_path).prepare(ref, claim)
    spec = read_spec(tmp_path)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    gpu = CAPTURED_GPUS[int(result["device"].removeprefix("gpu-"))]
    assert spec["cdiVersion"] == CDI_VERSION
    assert spec["kind"] == f"{DRIVER}/gpu"
    assert spec["devices"][0]["name"] == result["shareID"]
    assert f"{spec['kind']}={spec['devices'][0]['name']}" in device.cdi_device_ids
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": f"/dev/nvidia{gpu.minor_number}"}
    ]
    assert {"path": "/dev/nvidiactl"} in spec["containerEdits"]["deviceNodes"]
    assert env_of(spec) == {
        "NVIDIA_VISIBLE_DEVICES": gpu.uuid,
        "METAGPU_UNITS": str(units),
        "METAGPU_MEMORY_LIMIT_MB": str(memory_mib),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mib}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent),
        "METAGPU_COMPUTE_POLICY": "fixed",
        "METAGPU_AGENT_SOCKET": "/var/run/metagpu/agent.sock",
    }
    # mgctl in the container finds the node agent, as in device-plugin containers
    assert spec["devices"][0]["containerEdits"]["mounts"] == [
        {
            "hostPath": "/var/run/metagpu",
            "containerPath": "/var/run/metagpu",
            "options": ["rbind", "ro", "nosuid", "nodev"],
        }
    ]


def test_without_an_agent_no_socket_is_mounted(tmp_path: Path) -> None:
    claim = load("claim-p50-a-50-units-40gi-allocated.json")
    preparer(tmp_path, agent_socket_dir=None).prepare(ref_of(claim), claim)
    spec = read_spec(tmp_path)
    assert "METAGPU_AGENT_SOCKET" not in env_of(spec)
    assert "mounts" not in spec["devices"][0]["containerEdits"]


def test_balance_sets_no_sm_cap(tmp_path: Path) -> None:
    claim = load("claim-p50-a-50-units-40gi-allocated.json")
    preparer(tmp_path, compute_policy="balance").prepare(ref_of(claim), claim)
    env = env_of(read_spec(tmp_path))
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    assert env["METAGPU_COMPUTE_POLICY"] == "balance"


def test_a_whole_device_gets_the_formula_memory(tmp_path: Path) -> None:
    share = AllocatedShare("gpu", NODE, "gpu-0", None, None, None)
    limits = share_limits(share, gpu=CAPTURED_GPUS[0], config=dra_config(tmp_path))
    assert (limits.units, limits.memory_mib, limits.thread_percentage) == (100, 81920, 100)


def test_two_shares_of_one_gpu_get_two_spec_files(tmp_path: Path) -> None:
    p = preparer(tmp_path)
    a = load("claim-p50-a-50-units-40gi-allocated.json")
    b = load("claim-p50-b-50-units-40gi-allocated.json")
    (da,) = p.prepare(ref_of(a), a)
    (db,) = p.prepare(ref_of(b), b)
    assert da.device_name == db.device_name == "gpu-0"
    assert da.cdi_device_ids != db.cdi_device_ids
    names = {json.loads(f.read_text())["devices"][0]["name"] for f in tmp_path.glob("*.json")}
    assert names == {da.share_id, db.share_id}


def test_two_requests_of_one_claim_on_one_gpu_get_two_specs(tmp_path: Path) -> None:
    claim = load("claim-p50-a-50-units-40gi-allocated.json")
    results = claim["status"]["allocation"]["devices"]["results"]
    second = copy.deepcopy(results[0])
    second.update(request="gpu2", shareID="11111111-2222-4333-8444-555555555555")
    second["consumedCapacity"] = {"memory": "10Gi", "units": "20"}
    results.append(second)
    first, other = preparer(tmp_path).prepare(ref_of(claim), claim)
    assert (first.request_names, other.request_names) == (("gpu",), ("gpu2",))
    assert first.device_name == other.device_name == "gpu-0"
    specs = {
        json.loads(f.read_text())["devices"][0]["name"]: env_of(json.loads(f.read_text()))
        for f in tmp_path.glob("*.json")
    }
    assert specs[first.share_id or ""]["METAGPU_UNITS"] == "50"
    assert specs[other.share_id or ""]["METAGPU_UNITS"] == "20"


def test_prepare_twice_gives_the_same_answer_and_bytes(tmp_path: Path) -> None:
    p = preparer(tmp_path)
    claim = load("claim-p50-a-50-units-40gi-allocated.json")
    first = p.prepare(ref_of(claim), claim)
    (path,) = tmp_path.glob("*.json")
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    assert p.prepare(ref_of(claim), claim) == first
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before  # not even rewritten
    assert [f.name for f in tmp_path.iterdir()] == [path.name]  # no temporary files left


def test_unprepare_removes_the_claims_specs_only(tmp_path: Path) -> None:
    p = preparer(tmp_path)
    a = load("claim-p50-a-50-units-40gi-allocated.json")
    b = load("claim-p50-b-50-units-40gi-allocated.json")
    p.prepare(ref_of(a), a)
    p.prepare(ref_of(b), b)
    assert p.unprepare(ref_of(a)) == 1
    (left,) = tmp_path.glob("*.json")
    assert ref_of(b).uid in left.name
    assert p.unprepare(ref_of(a)) == 0  # again: nothing to do, no error
    assert p.unprepare(ClaimRef("ns", "never-seen", "0000")) == 0


def test_a_withdrawn_gpu_refuses_new_shares_but_keeps_prepared_ones(tmp_path: Path) -> None:
    p = preparer(tmp_path)
    a = load("claim-p50-a-50-units-40gi-allocated.json")
    b = load("claim-p50-b-50-units-40gi-allocated.json")
    first = p.prepare(ref_of(a), a)
    p.offer(CAPTURED_GPUS, withdrawn={CAPTURED_GPUS[0].uuid: "XID 79: fell off the bus"})
    assert p.prepare(ref_of(a), a) == first  # the kubelet repeating itself
    with pytest.raises(ClaimError, match=r"GPU gpu-0 \(GPU-.*0001\) is withdrawn: XID 79"):
        p.prepare(ref_of(b), b)


def test_a_device_this_node_does_not_have_is_refused(tmp_path: Path) -> None:
    p = Preparer(config=dra_config(tmp_path), node_name=NODE)
    p.offer(CAPTURED_GPUS[:1], withdrawn={})
    claim = load("claim-p50-c-50-units-40gi-allocated.json")  # on gpu-1
    with pytest.raises(ClaimError, match="device gpu-1 is not a GPU of node localhost"):
        p.prepare(ref_of(claim), claim)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_no_file(tmp_path: Path) -> None:
    blocker = tmp_path / "cdi"
    blocker.write_text("a file where the directory should be")
    p = preparer(blocker)
    claim = load("claim-p50-a-50-units-40gi-allocated.json")
    with pytest.raises(ClaimError, match="cannot write its CDI spec"):
        p.prepare(ref_of(claim), claim)


def test_claim_object_helper_matches_a_captured_claim() -> None:
    """The prepare-call fixtures carry only the allocation; the rebuilt claim must read
    like a captured one so the tests above mean the same thing for both."""
    claim = load("claim-p50-a-50-units-40gi-allocated.json")
    rebuilt = claim_object(ref_of(claim), claim["status"]["allocation"])
    assert shares_of(rebuilt, ref=ref_of(claim), driver=DRIVER, node_name=NODE) == shares_of(
        claim, ref=ref_of(claim), driver=DRIVER, node_name=NODE
    )


def test_device_health_lists_identified_gpus_with_their_state() -> None:
    lost = replace(CAPTURED_GPUS[1], identity_known=False)
    sick = GpuHealth(
        uuid=CAPTURED_GPUS[0].uuid, state="Unhealthy", reason="XID 79", check="xid", since=1234.9
    )
    entries = device_health((CAPTURED_GPUS[0], lost), records={sick.uuid: sick}, pool=NODE)
    assert entries == (DeviceHealthEntry(NODE, "gpu-0", healthy=False, last_updated_s=1234),)
    assert device_health(CAPTURED_GPUS, records={}, pool=NODE)[1].healthy


def test_an_extra_cdi_device_names_the_gpu_for_nvidias_spec(tmp_path: Path) -> None:
    claim = load("claim-p50-c-50-units-40gi-allocated.json")  # gpu-1
    (device,) = preparer(tmp_path, extra_cdi_device="nvidia.com/gpu={uuid}").prepare(
        ref_of(claim), claim
    )
    assert device.cdi_device_ids == (
        f"{DRIVER}/gpu={device.share_id}",
        f"nvidia.com/gpu={CAPTURED_GPUS[1].uuid}",
    )
    (by_index,) = preparer(tmp_path, extra_cdi_device="nvidia.com/gpu={index}").prepare(
        ref_of(claim), claim
    )
    assert by_index.cdi_device_ids[1] == "nvidia.com/gpu=1"


@pytest.mark.parametrize(
    ("template", "message"),
    [("nvidia.com/gpu={serial}", "only {uuid}"), ("gpu={uuid}", "not a CDI device ID")],
)
def test_a_bad_extra_cdi_device_fails_at_start(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DraConfig.model_validate({"extra_cdi_device": template})
