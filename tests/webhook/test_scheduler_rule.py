"""Rule 3's scheduler step: metagpu pods go to the GPU-aware scheduler when one is deployed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webhook.builders import allowed, applied, container, gpu, pod, settings
from webhook.rules import mutate_pod

ON = settings(scheduler_name="metagpu-scheduler")


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        pytest.param(None, "metagpu-scheduler", id="unset"),
        pytest.param("default-scheduler", "metagpu-scheduler", id="the API server's default"),
        pytest.param("metagpu-scheduler", "metagpu-scheduler", id="already ours"),
    ],
)
def test_metagpu_pods_are_pointed_at_the_gpu_aware_scheduler(
    scheduler: str | None, expected: str
) -> None:
    extra: dict[str, Any] = {"schedulerName": scheduler} if scheduler else {}
    the_pod = pod(gpu("0.5"), **extra)
    decision = mutate_pod(the_pod, settings=ON)
    assert applied(the_pod, decision)["spec"]["schedulerName"] == expected
    mutation = allowed(decision)
    assert not any("schedulerName" in w for w in mutation.warnings)


def test_a_pod_naming_another_scheduler_is_left_alone_with_a_warning() -> None:
    the_pod = pod(gpu("0.5"), schedulerName="volcano")
    decision = mutate_pod(the_pod, settings=ON)
    assert applied(the_pod, decision)["spec"]["schedulerName"] == "volcano"
    warnings = allowed(decision).warnings
    assert any("schedulerName 'volcano' kept" in w for w in warnings), warnings


@pytest.mark.parametrize(
    ("the_settings", "the_pod"),
    [
        pytest.param(settings(), pod(gpu("0.5")), id="off by default"),
        pytest.param(ON, pod(container("web")), id="pods without metagpu"),
        pytest.param(ON, pod(gpu(1)), id="whole NVIDIA GPUs"),
    ],
)
def test_other_pods_keep_their_scheduler(the_settings: Any, the_pod: dict[str, Any]) -> None:
    decision = mutate_pod(the_pod, settings=the_settings)
    assert "schedulerName" not in applied(the_pod, decision)["spec"]


def test_mutating_twice_equals_mutating_once() -> None:
    once = applied(pod(gpu("0.5")), mutate_pod(pod(gpu("0.5")), settings=ON))
    twice = applied(once, mutate_pod(once, settings=ON))
    assert twice == once


def test_scheduler_name_is_checked_at_start_up() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="DNS subdomain"):
        settings(scheduler_name="Not A Name")
