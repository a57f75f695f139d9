"""Remembered GPU identity (issue 15, item 1): pure, no driver."""

from __future__ import annotations

import dataclasses

from plugin.api.gpus import GpuInfo
from plugin.gpu.identity import GONE_REASON, GpuIdentityBook
from tests.plugin.builders import gpu, uuid_for

LOST = "NVML could not get a handle of GPU 1: GPU is lost"


def unidentified(index: int) -> GpuInfo:
    """What NVML discovery returns for a GPU it cannot even ask its UUID."""
    return GpuInfo(
        index=index,
        uuid=f"GPU-unknown-index-{index}",
        name="unknown",
        memory_mib=0,
        minor_number=index,
        pci_bus_id="",
        numa_node=None,
        unhealthy_reason=LOST,
        identity_known=False,
    )


def test_a_lost_gpu_gets_the_identity_seen_at_its_index() -> None:
    book = GpuIdentityBook()
    first = [gpu(0), gpu(1, memory_mib=40960), gpu(2)]
    assert book.reconcile(first).gpus == tuple(first)
    result = book.reconcile([gpu(0), unidentified(1), gpu(2)])
    lost = result.gpus[1]
    assert lost == dataclasses.replace(first[1], unhealthy_reason=LOST)
    assert lost.identity_known
    assert result.unidentified == ()


def test_a_gpu_never_seen_is_left_out() -> None:
    result = GpuIdentityBook().reconcile([gpu(0), unidentified(1)])
    assert [g.uuid for g in result.gpus] == [uuid_for(0)]
    assert [g.index for g in result.unidentified] == [1]


def test_an_index_whose_gpu_is_found_elsewhere_is_not_reused() -> None:
    """The driver renumbered: GPU 1's UUID now answers at index 0, so the unknown
    GPU at index 1 is not GPU 1."""
    book = GpuIdentityBook()
    book.reconcile([gpu(0), gpu(1)])
    moved = dataclasses.replace(gpu(1), index=0)
    result = book.reconcile([moved, unidentified(1)])
    assert [g.uuid for g in result.gpus] == [uuid_for(1)]
    assert [g.index for g in result.unidentified] == [1]


def test_a_gpu_the_driver_no_longer_lists_stays_unhealthy() -> None:
    book = GpuIdentityBook()
    book.reconcile([gpu(0), gpu(1)])
    result = book.reconcile([gpu(0)])
    assert [(g.uuid, g.unhealthy_reason) for g in result.gpus] == [
        (uuid_for(0), None),
        (uuid_for(1), GONE_REASON),
    ]


def test_a_partly_described_gpu_keeps_what_was_known() -> None:
    book = GpuIdentityBook()
    book.reconcile([gpu(0)])
    partial = dataclasses.replace(
        gpu(0), name="unknown", memory_mib=0, pci_bus_id="", unhealthy_reason="name failed"
    )
    (result,) = book.reconcile([partial]).gpus
    assert (result.name, result.memory_mib, result.pci_bus_id) == (
        gpu(0).name,
        gpu(0).memory_mib,
        gpu(0).pci_bus_id,
    )
    assert result.unhealthy_reason == "name failed"


def test_learned_identities_name_a_gpu_this_reader_never_saw() -> None:
    """The agent learns from the plugin's board."""
    book = GpuIdentityBook()
    book.learn([gpu(0), gpu(1)])
    result = book.reconcile([gpu(0), unidentified(1)])
    assert [g.uuid for g in result.gpus] == [uuid_for(0), uuid_for(1)]
