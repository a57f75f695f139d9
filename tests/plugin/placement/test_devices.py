"""Meta-devices: GPU selection per resource, IDs, lookups and the advertised list."""

from __future__ import annotations

import pytest

from plugin.api.config import ResourceConfig
from plugin.api.limits import memory_limit_mib
from plugin.api.resources import RESOURCE_NAME_MAX_LEN, parse_replica_id
from plugin.placement.devices import (
    GpuSelectionError,
    UnknownDeviceError,
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


@pytest.mark.parametrize(
    "selectors",
    [
        pytest.param([0, uuid_for(0)], id="index-and-uuid"),
        pytest.param([uuid_for(1).upper(), 1], id="uuid-any-case-and-index"),
    ],
)
def test_one_gpu_selected_twice_by_one_resource_is_refused(selectors: list[object]) -> None:
    """Only discovery can tell that an index and a UUID name the same GPU; without
    this check the table failed later with "two GPUs share a device ID", which
    the supervisor took for a discovery failure and retried forever."""
    with pytest.raises(GpuSelectionError) as err:
        select_gpus(gpus(2), resources(("cnvrg.io/metagpu", selectors)))
    message = str(err.value)
    for fragment in ("cnvrg.io/metagpu", "twice", repr(selectors[0]), repr(selectors[1])):
        assert fragment in message


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
    (found,) = t.lookup_all([f"{uuid_for(1)}::5"])
    assert found.gpu.info.index == 1
    for bad in (f"{uuid_for(1)}::100", "GPU-x::0", "garbage", ""):
        with pytest.raises(UnknownDeviceError) as err:
            t.lookup_all([bad])
        assert f"unknown device: {bad}" in str(err.value)


def test_lookup_all_drops_duplicates_and_fails_whole() -> None:
    t = table(gpus(1))
    a, b = f"{uuid_for(0)}::1", f"{uuid_for(0)}::2"
    assert [d.id for d in t.lookup_all([a, b, a])] == [a, b]
    with pytest.raises(UnknownDeviceError, match="unknown device: nope"):
        t.lookup_all([a, "nope", b])


@pytest.mark.parametrize(
    ("units", "units_per_gpu", "memory_mib", "expected"),
    [
        pytest.param(50, 100, 81920, 40960, id="half"),
        pytest.param(100, 100, 81920, 81920, id="whole"),
        pytest.param(1, 3, 1000, 333, id="floored-to-whole-mib"),
        pytest.param(0, 100, 81920, 0, id="none"),
    ],
)
def test_memory_limit_mib(units: int, units_per_gpu: int, memory_mib: int, expected: int) -> None:
    limit = memory_limit_mib(units, units_per_gpu=units_per_gpu, memory_total_mib=memory_mib)
    assert limit == expected
