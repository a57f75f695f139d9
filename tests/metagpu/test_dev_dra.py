"""``metagpu dev --dra``: its prompt, its scheduler against the captured allocations, and
one real session end to end (the DRA plugin registered with the simulated kubelet)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metagpu.dev_dra import (
    AllocateClaim,
    Allocated,
    CreateClaim,
    DeleteClaim,
    PrepareClaim,
    ShowClaims,
    ShowSlice,
    UnprepareClaim,
    allocate_claim,
    parse_dra_prompt,
)
from metagpu.dev_dra_session import READY_LINE
from metagpu.dev_prompt import PromptError, Quit, ShowHelp
from tests.metagpu.test_dev import Session
from tests.plugin.dra.fixtures import DRIVER, NODE, load


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param("", None, id="blank"),
        pytest.param("claim 50", CreateClaim(50, None, "50"), id="units"),
        pytest.param("claim 0.5", CreateClaim(50, None, "0.5"), id="fraction"),
        pytest.param("claim 50 20Gi", CreateClaim(50, 20480, "50 20Gi"), id="units-memory"),
        pytest.param("claim 10Gi", CreateClaim(None, 10240, "10Gi"), id="memory-only"),
        pytest.param("claim 1500Mi", CreateClaim(None, 1500, "1500Mi"), id="mebibytes"),
        pytest.param("allocate 1", AllocateClaim(1), id="allocate"),
        pytest.param("allocate claim-2", AllocateClaim(2), id="by-name"),
        pytest.param("prepare 1", PrepareClaim(1), id="prepare"),
        pytest.param("UNPREPARE 1", UnprepareClaim(1), id="unprepare"),
        pytest.param("delete 3", DeleteClaim(3), id="delete"),
        pytest.param("claims", ShowClaims(), id="claims"),
        pytest.param("slice", ShowSlice(), id="slice"),
        pytest.param("help", ShowHelp(), id="help"),
        pytest.param("quit", Quit(), id="quit"),
    ],
)
def test_dra_prompt_commands(line: str, expected: object) -> None:
    assert parse_dra_prompt(line, units_per_gpu=100) == expected


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        pytest.param("claim", "usage: claim", id="nothing"),
        pytest.param("claim 0.333", "not a whole number of units", id="not-whole"),
        pytest.param("claim 150", "more than one GPU", id="two-gpus"),
        pytest.param("claim 0", "not a whole number of units", id="zero"),
        pytest.param("claim 10Gi 50", "usage: claim", id="memory-first"),
        pytest.param("claim 10G", "usage: claim", id="decimal-suffix"),
        pytest.param("allocate", "usage: allocate <claim number>", id="no-number"),
        pytest.param("prepare 0", "whole number >= 1", id="zero-number"),
        pytest.param("prepare ٣", "whole number >= 1", id="arabic-indic-digit"),
        pytest.param("slice 1", "usage: slice", id="slice-argument"),
        pytest.param("xid 0 79", "unknown command 'xid'", id="unknown"),
    ],
)
def test_dra_prompt_errors_say_what_would_be_accepted(line: str, fragment: str) -> None:
    with pytest.raises(PromptError, match=fragment):
        parse_dra_prompt(line, units_per_gpu=100)


def captured_slice() -> dict[str, Any]:
    stored: dict[str, Any] = load("resourceslice-consumable-accepted.json")["response"]["body"]
    return stored


def allocate(claim: dict[str, Any], *allocated: str) -> Allocated | str:
    return allocate_claim(
        claim,
        slices=[captured_slice()],
        allocated=[load(name) for name in allocated],
        driver=DRIVER,
        node_name=NODE,
        share_id="share-under-test",
    )


def unallocated(name: str) -> dict[str, Any]:
    claim: dict[str, Any] = load(name)
    return {**claim, "status": {}}


@pytest.mark.parametrize(
    ("name", "before"),
    [
        pytest.param("claim-p50-a-50-units-40gi-allocated.json", (), id="p50-a"),
        pytest.param(
            "claim-p50-b-50-units-40gi-allocated.json",
            ("claim-p50-a-50-units-40gi-allocated.json",),
            id="p50-b-beside-a",
        ),
        pytest.param(
            "claim-p50-c-50-units-40gi-allocated.json",
            (
                "claim-p50-a-50-units-40gi-allocated.json",
                "claim-p50-b-50-units-40gi-allocated.json",
            ),
            id="p50-c-to-gpu-1",
        ),
        pytest.param("claim-1500mi-rounded-allocated.json", (), id="1500mi-charged-2gi"),
        pytest.param("claim-10gi-memory-only-allocated.json", (), id="memory-only"),
        pytest.param("claim-no-capacity-request-allocated.json", (), id="defaults"),
        pytest.param(
            "claim-70-units-allocated-after-release.json",
            ("claim-60-units-b-allocated.json",),
            id="70-after-release",
        ),
    ],
)
def test_the_dev_scheduler_allocates_as_kube_scheduler_did(
    name: str, before: tuple[str, ...]
) -> None:
    """Same device and consumed capacity as the captured allocation (the shareID is new)."""
    captured = load(name)
    result = allocate(unallocated(name), *before)
    assert isinstance(result, Allocated), result
    (mine,) = result.allocation["devices"]["results"]
    (theirs,) = captured["status"]["allocation"]["devices"]["results"]
    assert mine == {**theirs, "shareID": "share-under-test"}
    assert result.allocation["nodeSelector"] == captured["status"]["allocation"]["nodeSelector"]


def test_the_captured_70_beside_60_and_60_waits_and_says_why() -> None:
    waiting = load("event-70-units-unschedulable.json")["claim"]
    result = allocate(waiting, "claim-60-units-a-allocated.json", "claim-60-units-b-allocated.json")
    assert result == (
        "no single GPU has 70 free units (largest 40; 80 free in total)"
        " (free: gpu-0 40 units, 79Gi; gpu-1 40 units, 79Gi)"
    )


TWO_A100: dict[str, Any] = {
    "gpus": [
        {
            "uuid": f"GPU-0b1c2d3e-0000-4000-8000-00000000000{i + 1}",
            "name": "NVIDIA A100-SXM4-80GB",
            "memory_mib": 81920,
            "index": i,
            "minor_number": i,
            "numa_node": 0,
            "pci_bus_id": f"00000000:0{7 + 4 * i:X}:00.0",
        }
        for i in range(2)
    ]
}
"""The captured node: two A100-SXM4-80GB."""


@pytest.fixture
def dra_session(short_tmp_path: Path) -> Iterator[Session]:
    gpus = short_tmp_path / "gpus.yaml"
    gpus.write_text(yaml.safe_dump(TWO_A100))
    run = Session(short_tmp_path / "run", "--dra", "--gpus-file", str(gpus))
    try:
        yield run
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait(timeout=30)


@pytest.mark.slow
def test_dev_dra_session_end_to_end(dra_session: Session, short_tmp_path: Path) -> None:
    """Issue 29: ``make run`` can run the DRA mode against its simulated kubelet. The
    captured 60 + 60 + 70 case, prepared through NodePrepareResources over the real protos."""
    session = dra_session
    run = short_tmp_path / "run"
    session.wait_line(READY_LINE)
    info = json.loads(session.wait_line("  GetInfo ").split(None, 1)[1])
    assert info == {
        "type": "DRAPlugin",
        "name": DRIVER,
        "endpoint": str(run / "plugins" / DRIVER / "dra.sock"),
        "supported_versions": ["v1.DRAPlugin"],
    }
    assert session.wait_line("  health ").split(None, 1)[1] == "gpu-0 HEALTHY, gpu-1 HEALTHY"
    session.wait_line("ResourceSlice  dev-node-gpu.metagpu.io: 2 devices (gpu-0, gpu-1)")

    # The webhook's shapes: 60 units get 48Gi of an 80Gi GPU; one share per GPU.
    session.send("claim 0.6")
    session.wait_line("claim 1: dev/claim-1 from template metagpu-60u-48gi")
    session.send("allocate 1")
    assert "gpu-0 share " in session.wait_line("claim 1 allocated:")
    session.send("claim 60")
    session.send("allocate 2")
    assert "gpu-1 share " in session.wait_line("claim 2 allocated:")
    session.send("claim 70")
    session.send("allocate 3")
    session.wait_line("claim 3 stays Pending: the scheduler says `cannot allocate all claims`")
    why = session.wait_line("  metagpu says: ")
    assert "no single GPU has 70 free units (largest 40; 80 free in total)" in why

    # Prepare: the kubelet's call, the plugin's answer and the CDI spec it wrote.
    session.send("prepare 1")
    answer = json.loads(session.wait_line("NodePrepareResources claim 1: ").split(": ", 1)[1])
    (device,) = answer["devices"]
    assert device["device_name"] == "gpu-0"
    assert device["pool_name"] == "dev-node"
    assert device["cdi_device_ids"] == [f"{DRIVER}/gpu={device['share_id']}"]
    session.wait_line('"METAGPU_UNITS=60"')
    session.wait_line('"METAGPU_MEMORY_LIMIT_MB=49152"')
    specs = list((run / "cdi").glob("*.json"))
    assert len(specs) == 1
    session.send("prepare 1")  # the kubelet after its restart: the same answer
    again = json.loads(session.wait_line("NodePrepareResources claim 1: ").split(": ", 1)[1])
    assert again == answer
    session.send("unprepare 1")
    assert "0 CDI spec file(s) left" in session.wait_line("NodeUnprepareResources claim 1: ")
    assert not list((run / "cdi").glob("*.json"))

    # Deleting claim 2 frees gpu-1, and the waiting 70 gets it.
    session.send("delete 2")
    session.wait_line("claim 2 deleted")
    session.send("allocate 3")
    assert "gpu-1 share " in session.wait_line("claim 3 allocated:")
    session.send("slice")
    session.wait_line("  name: dev-node-gpu.metagpu.io")
    assert session.wait_line("  gpu-1  ").split() == [
        "gpu-1",
        "30/100",
        "units",
        "24Gi/80Gi",
        "memory",
    ]
    session.send("prepare 9")
    session.wait_line("error: no claim 9 (claims: 1, 3)")

    session.process.send_signal(signal.SIGINT)
    session.wait_line("metagpu dev --dra stopped")
    assert session.process.wait(timeout=60) == 0
    assert not list(run.rglob("*.sock")), "sockets left behind"
