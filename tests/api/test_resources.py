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
    is_dns_label,
    is_dns_subdomain,
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
        pytest.param("cnvrg.io/metagpu\n", "alphanumeric", id="newline-after-name"),
        pytest.param("cnvrg.io\n/metagpu", "DNS subdomain", id="newline-after-domain"),
    ],
)
def test_invalid_resource_names_say_why(name: str, fragment: str) -> None:
    with pytest.raises(ResourceNameError, match=fragment) as info:
        ResourceName(name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize(
    ("value", "label", "subdomain"),
    [
        pytest.param("metagpu", True, True, id="label"),
        pytest.param("a", True, True, id="one-char"),
        pytest.param("metagpu-webhook-tls", True, True, id="dashes"),
        pytest.param("a" * 63, True, True, id="63"),
        pytest.param("a" * 64, False, True, id="64"),
        pytest.param("cnvrg.io", False, True, id="dotted"),
        pytest.param(".".join(["a" * 63] * 4)[:253], False, True, id="253"),
        pytest.param("a" * 254, False, False, id="254"),
        pytest.param("", False, False, id="empty"),
        pytest.param("-a", False, False, id="leading-dash"),
        pytest.param("a-", False, False, id="trailing-dash"),
        pytest.param("A", False, False, id="upper-case"),
        pytest.param("a_b", False, False, id="underscore"),
        pytest.param("a..b", False, False, id="empty-label"),
        pytest.param("metagpu-webhook-tls\n", False, False, id="trailing-newline"),
        pytest.param("a\n.b", False, False, id="newline-inside"),
        pytest.param("\u0661", False, False, id="unicode-digit"),
        pytest.param("caf\u00e9", False, False, id="unicode-letter"),
    ],
)
def test_dns_names_are_checked_like_kubernetes(value: str, label: bool, subdomain: bool) -> None:
    assert is_dns_label(value) is label
    assert is_dns_subdomain(value) is subdomain


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
