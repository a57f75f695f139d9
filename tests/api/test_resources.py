"""The shared resource contract: names the kubelet accepts and meta-device IDs."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plugin.api.resources import (
    RESOURCE_NAME_MAX_LEN,
    DeviceId,
    ReplicaIdError,
    ResourceName,
    ResourceNameError,
    format_replica_id,
    parse_replica_id,
)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("cnvrg.io/metagpu", id="default"),
        pytest.param("cnvrg.io/metagpu-a100", id="per-product"),
        pytest.param("example.com/" + "a" * 63, id="63-chars"),
        pytest.param("nvidia.com/gpu.shared", id="dots"),
    ],
)
def test_valid_resource_names(name: str) -> None:
    rn = ResourceName(name)
    assert rn == name
    assert rn.domain + "/" + rn.short_name == name


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        pytest.param("metagpu", "<domain>/<name>", id="no-slash"),
        pytest.param("/metagpu", "<domain>/<name>", id="empty-domain"),
        pytest.param("cnvrg.io/", "<domain>/<name>", id="empty-name"),
        pytest.param("localhost/gpu", "with a dot", id="domain-without-dot"),
        pytest.param("kubernetes.io/gpu", "reserved", id="reserved-domain"),
        pytest.param("example.com/" + "a" * 64, "63 characters or less", id="64-chars"),
        pytest.param("example.com/-gpu", "alphanumeric", id="leading-dash"),
        pytest.param("Example.com/gpu", "DNS subdomain", id="uppercase-domain"),
    ],
)
def test_invalid_resource_names_say_why(name: str, fragment: str) -> None:
    with pytest.raises(ResourceNameError, match=fragment) as info:
        ResourceName(name)
    assert repr(name) in str(info.value)


def test_replica_id_format() -> None:
    gpu = DeviceId("GPU-0b8a5e3c-1f6e-4a53-9c1e-2d7b8f1a0c01")
    rid = format_replica_id(gpu, 17)
    assert rid == "GPU-0b8a5e3c-1f6e-4a53-9c1e-2d7b8f1a0c01::17"
    assert len(rid) <= RESOURCE_NAME_MAX_LEN
    assert parse_replica_id(rid) == (gpu, 17)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("GPU-x", id="no-separator"),
        pytest.param("::3", id="no-gpu"),
        pytest.param("GPU-x::", id="no-unit"),
        pytest.param("GPU-x::-1", id="negative"),
        pytest.param("GPU-x::01", id="leading-zero"),
        pytest.param("GPU-x::²", id="unicode-digit"),
    ],
)
def test_bad_replica_ids_are_rejected(value: str) -> None:
    with pytest.raises(ReplicaIdError, match="<gpu>::<n>"):
        parse_replica_id(value)


def test_replica_id_too_long_is_rejected() -> None:
    with pytest.raises(ReplicaIdError, match="63 characters or less"):
        format_replica_id(DeviceId("G" * 60), 1000)


_gpu_ids = st.one_of(
    st.uuids().map(lambda u: f"GPU-{u}"),
    st.uuids().map(lambda u: f"MIG-{u}"),
    st.integers(min_value=0, max_value=63).map(str),
)


@given(gpu=_gpu_ids, unit=st.integers(min_value=0, max_value=9999))
@example(gpu="0", unit=0)
def test_replica_id_round_trips(gpu: str, unit: int) -> None:
    rid = format_replica_id(DeviceId(gpu), unit)
    assert len(rid) <= RESOURCE_NAME_MAX_LEN
    assert parse_replica_id(rid) == (gpu, unit)
