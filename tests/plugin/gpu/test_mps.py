"""The MPS command interface and decisions (pure), with replies a real daemon gave.

The replies are driver 580.159.04's on an H100 (docs/benchmarks.md, "MPS")."""

from __future__ import annotations

import pytest

from plugin.api.limits import container_limits, pinned_limit_env, thread_percentage
from plugin.gpu.mps import (
    Backoff,
    MpsGpu,
    MpsReplyError,
    check_default,
    daemon_defaults,
    parse_server_list,
    parse_value,
)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param("", (), id="no server yet"),
        pytest.param("794\n", (794,), id="one server"),
        pytest.param("794\n1004\n", (794, 1004), id="two users"),
    ],
)
def test_server_list(reply: str, expected: tuple[int, ...]) -> None:
    assert parse_server_list(reply) == expected


def test_server_list_rejects_an_error_message() -> None:
    with pytest.raises(MpsReplyError, match="Unknown command"):
        parse_server_list('Unknown command "get_server_lists"\n')


@pytest.mark.parametrize(
    ("reply", "unit", "expected"),
    [
        pytest.param("100.0\n", "percent", 100.0, id="percent as 580 prints it"),
        pytest.param("25", "percent", 25.0, id="bare"),
        pytest.param("79G\n", "MiB", 79 * 1024, id="whole GiB as 580 shows 81559M"),
        pytest.param("512M\n", "MiB", 512, id="MiB"),
    ],
)
def test_values(reply: str, unit: str, expected: float) -> None:
    assert parse_value(reply, unit) == expected  # type: ignore[arg-type]


def test_defaults_are_the_whole_gpu_and_read_back() -> None:
    gpu = MpsGpu(uuid="GPU-a", index=0, memory_mib=81559)
    thread, memory = daemon_defaults([gpu])
    assert thread.set_command == "set_default_active_thread_percentage 100"
    assert memory.set_command == "set_default_device_pinned_mem_limit 0 81559M"
    assert memory.get_command == "get_default_device_pinned_mem_limit 0"
    assert check_default(memory, "79G\n") is None  # 580's display, within a GiB
    assert check_default(thread, "100.0\n") is None
    # 580 answers an out-of-range set with the unchanged value: caught by the read-back
    low = daemon_defaults([gpu])[0]
    assert check_default(low, "10.0\n") is not None
    problem = check_default(memory, "")  # a device the daemon does not know
    assert problem is not None
    assert "did not take" in problem


def test_backoff_doubles_up_to_its_ceiling() -> None:
    b = Backoff(initial_s=1, max_s=10)
    assert [b.delay(n) for n in (1, 2, 3, 4, 5, 100)] == [1, 2, 4, 8, 10, 10]


@pytest.mark.parametrize(
    ("units", "policy", "percent"),
    [
        pytest.param(25, "fixed", 25, id="fixed caps at the share"),
        pytest.param(33, "fixed", 33, id="whole percent"),
        pytest.param(150, "fixed", 100, id="more than one GPU: per GPU at most 100"),
        pytest.param(25, "balance", None, id="balance: no cap"),
        pytest.param(25, "none", None, id="none: no cap"),
    ],
)
def test_thread_percentage(units: int, policy: str, percent: int | None) -> None:
    assert thread_percentage(units, units_per_gpu=100, policy=policy) == percent  # type: ignore[arg-type]


def test_container_limits_and_env() -> None:
    limits = container_limits([(25, 81559), (100, 40960)], units_per_gpu=100, policy="fixed")
    assert [x.memory_mib for x in limits] == [20389, 40960]
    assert [x.thread_percentage for x in limits] == [25, 100]
    assert pinned_limit_env([x.memory_mib for x in limits]) == "0=20389M,1=40960M"
