"""Meta-devices: GPU selection per resource, IDs, lookups and the advertised list."""

from __future__ import annotations

import pytest

from plugin.api.config import ResourceConfig
from plugin.api.resources import RESOURCE_NAME_MAX_LEN, parse_replica_id
from plugin.devices import (
    HEALTHY,
    UNHEALTHY,
    GpuSelectionError,
    UnknownDeviceError,
    listing,
    select_gpus,
)
from tests.plugin.builders import gpu, gpus, table, uuid_for


def resources(*items: tuple[str, object]) -> list[ResourceConfig]:
    return [ResourceConfig.model_validate({"name": n, "gpus": g}) for n, g in items]


@pytest.mark.parametrize(
    ("selectors", "expected_indices", "warning"),
    [
        pytest.param("all", [0, 1, 2, 3], None, id="all"),
        pytest.param([2, 0], [0, 2], None, id="indices-in-nvml-order"),
        pytest.param(["1", 3], [1, 3], None, id="digit-strings-from-env-are-indices"),
        pytest.param([uuid_for(2).upper().replace("GPU", "gpu")], [2], None, id="uuid-any-case"),
        pytest.param([0, 7], [0], "no GPU 7 on this node", id="missing-index-warns"),
        pytest.param(["GPU-nope"], [], "no GPU 'GPU-nope'", id="missing-uuid-warns"),
    ],
)
def test_select_gpus(selectors: object, expected_indices: list[int], warning: str | None) -> None:
    selection = select_gpus(gpus(4), resources(("cnvrg.io/metagpu", selectors)))
    assert [g.index for g in selection.resources[0].gpus] == expected_indices
    if warning is None:
        assert selection.warnings == ()
    else:
        assert any(warning in w for w in selection.warnings)


def test_mig_gpus_are_skipped_with_a_reason() -> None:
    infos = [gpu(0), gpu(1, mig_enabled=True), gpu(2)]
    selection = select_gpus(infos, resources(("cnvrg.io/metagpu", "all")))
    assert [g.index for g in selection.resources[0].gpus] == [0, 2]
    (warning,) = selection.warnings
    assert "GPU 1" in warning
    assert "MIG" in warning
    assert "cannot be shared as a whole" in warning


def test_naming_a_mig_gpu_explicitly_warns_once() -> None:
    infos = [gpu(0), gpu(1, mig_enabled=True)]
    selection = select_gpus(infos, resources(("cnvrg.io/metagpu", [1])))
    assert selection.resources[0].gpus == ()
    assert len(selection.warnings) == 1


def test_one_gpu_named_by_index_and_uuid_in_two_resources_is_refused() -> None:
    with pytest.raises(GpuSelectionError) as err:
        select_gpus(gpus(2), resources(("cnvrg.io/a", [0]), ("cnvrg.io/b", [uuid_for(0)])))
    assert uuid_for(0) in str(err.value)
    assert "cnvrg.io/a" in str(err.value)
    assert "cnvrg.io/b" in str(err.value)


def test_two_resources_split_a_node() -> None:
    selection = select_gpus(gpus(4), resources(("cnvrg.io/a", [0, 1]), ("cnvrg.io/b", [2, 3])))
    assert [[g.index for g in r.gpus] for r in selection.resources] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("strategy", ["uuid", "index"])
def test_ids_carry_the_gpu_and_stay_short(strategy: str) -> None:
    t = table(gpus(16), units_per_gpu=1000, id_strategy=strategy)  # type: ignore[arg-type]
    assert len(t) == 16_000
    for device in (t.devices[0], t.devices[-1]):
        assert len(device.id) <= RESOURCE_NAME_MAX_LEN
        gpu_id, unit = parse_replica_id(device.id)
        assert gpu_id == device.gpu.device_id
        assert unit == device.unit
    expected = uuid_for(15) if strategy == "uuid" else "15"
    assert t.devices[-1].id == f"{expected}::999"


def test_ids_are_stable_across_rebuilds() -> None:
    first = [d.id for d in table(gpus(3)).devices]
    second = [d.id for d in table(list(reversed(gpus(3)))).devices]
    assert first == second


def test_lookup_names_the_unknown_id() -> None:
    t = table(gpus(2))
    assert t.lookup(f"{uuid_for(1)}::5").gpu.info.index == 1
    for bad in (f"{uuid_for(1)}::100", "GPU-x::0", "garbage", ""):
        with pytest.raises(UnknownDeviceError) as err:
            t.lookup(bad)
        assert f"unknown device: {bad}" in str(err.value)


def test_lookup_all_drops_duplicates_and_fails_whole() -> None:
    t = table(gpus(1))
    a, b = f"{uuid_for(0)}::1", f"{uuid_for(0)}::2"
    assert [d.id for d in t.lookup_all([a, b, a])] == [a, b]
    with pytest.raises(UnknownDeviceError, match="unknown device: nope"):
        t.lookup_all([a, "nope", b])


def test_listing_marks_every_meta_device_of_a_sick_gpu() -> None:
    infos = [gpu(0, numa_node=0), gpu(1, numa_node=1), gpu(2, numa_node=None)]
    t = table(infos, units_per_gpu=10)
    rows = listing(t, {uuid_for(1), "GPU-not-ours"})
    assert len(rows) == 30
    health: dict[str, set[tuple[str, int | None]]] = {}
    for device_id, state, numa in rows:
        gpu_id, _ = parse_replica_id(device_id)
        health.setdefault(gpu_id, set()).add((state, numa))
    assert health == {
        uuid_for(0): {(HEALTHY, 0)},
        uuid_for(1): {(UNHEALTHY, 1)},
        uuid_for(2): {(HEALTHY, None)},
    }
