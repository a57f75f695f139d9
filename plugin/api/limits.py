"""A container's limits from its share and compute policy: the one formula (pure, stdlib only).

The device plugin (``Allocate`` env), the webhook (the ``fixed`` cap it writes), the
node agent (enforcement, ``mgctl``, metrics) and the docs must all say the same
number for the same share, so each limit is computed here and nowhere else:

* **memory**: ``floor(memory_mib × units / units_per_gpu)`` MiB of each GPU, always,
  under MPS as ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``<ordinal>=<MiB>M``, keyed by
  the GPU's position in the container, comma-separated);
* **compute**: ``fixed`` caps the SMs at the share of one GPU in whole percent, rounded
  up (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``); ``balance`` and ``none`` set no cap.

MPS treats both variables as a ceiling a client may only lower: "The new limit will
only further constrain the limit set by the control daemon" (NVIDIA MPS docs,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``). So
the daemon's defaults are the whole GPU (:func:`daemon_default_commands` in
:mod:`plugin.gpu.mps`) and each container's own variables carry its share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

Policy = Literal["fixed", "balance", "none"]
"""The compute policies (``plugin.api.resources.COMPUTE_POLICIES``)."""

Enforced = Literal["memory", "fixed"]
"""What a node may hold a container to at allocation: its memory share
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and the ``fixed`` SM cap
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``). ``balance`` and ``none`` set no SM cap, so
there is nothing of theirs to enforce beyond memory."""

MpsMode = Literal["off", "unsupervised", "supervised"]
"""How a node's device plugin serves MPS: ``off`` (time-sliced GPUs), ``unsupervised``
(``mps.enabled``: containers get the limits, but a daemon someone else runs may or may
not be there, and the GPUs stay in the ``DEFAULT`` compute mode), ``supervised``
(``mps.supervise``: the plugin runs, watches and restarts the daemon, GPUs in
``EXCLUSIVE_PROCESS``, withdrawn while it is down)."""

ENFORCED_WHEN_SUPERVISED: Final[tuple[Enforced, ...]] = ("memory", "fixed")


def enforced_by(mode: MpsMode) -> tuple[Enforced, ...]:
    """What a node in ``mode`` enforces, in this fixed order (the label's value joins it).

    Only ``supervised``: an unsupervised daemon's limits hold only while a daemon
    nobody watches answers, and a process that ignores the pipe directory takes the
    GPU unlimited (compute mode ``DEFAULT``), so they are advice, not enforcement.
    While the supervised daemon is down its GPUs are offered to no new container, so
    every container the node admits is still held to both limits."""
    return ENFORCED_WHEN_SUPERVISED if mode == "supervised" else ()


FULL_THREAD_PERCENTAGE: Final = 100
"""MPS's own default active thread percentage: no cap."""


def memory_limit_mib(units: int, *, units_per_gpu: int, memory_total_mib: int) -> int:
    """The memory ``units`` of a GPU with ``memory_total_mib`` allow, floored to whole MiB.

    Floored, so the limits of the shares of one GPU never add up to more than it has."""
    return units * memory_total_mib // units_per_gpu


def share_percent(units: int, units_per_gpu: int) -> int:
    """A container's share of one GPU in whole percent, rounded up, 1..100.

    Rounded up so a share that is not a whole percent (333 of 1000 units) is
    never capped below what it was given; capped at 100 because
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` is per GPU.
    """
    return max(1, min(100, math.ceil(units * 100 / units_per_gpu)))


def thread_percentage(units: int, *, units_per_gpu: int, policy: Policy) -> int | None:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for a container, or None for no SM cap.

    ``fixed``: the share (:func:`share_percent`). ``balance``: no cap, so it may use
    what neighbours leave idle; MPS still schedules its kernels beside theirs rather
    than time-slicing the GPU. ``none``: no cap either."""
    if policy == "fixed":
        return share_percent(units, units_per_gpu)
    return None


def pinned_limit_value(memory_mib: int) -> str:
    """One limit as MPS writes it: an integer and ``M`` (MiB) or ``G``; MiB keeps it exact."""
    return f"{memory_mib}M"


def pinned_limit_env(limits_mib: Sequence[int]) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for a container holding these per-GPU limits,
    in the order of its ``NVIDIA_VISIBLE_DEVICES`` (CUDA ordinal 0, 1, ...)."""
    return ",".join(f"{ordinal}={pinned_limit_value(m)}" for ordinal, m in enumerate(limits_mib))


@dataclass(frozen=True)
class GpuLimit:
    """What one container may use of one GPU."""

    units: int
    memory_mib: int
    thread_percentage: int | None
    """None: no SM cap (``balance``, ``none``)."""


def container_limits(
    shares: Sequence[tuple[int, int]], *, units_per_gpu: int, policy: Policy
) -> tuple[GpuLimit, ...]:
    """Per GPU, from ``(units, memory_total_mib)`` pairs in container order."""
    return tuple(
        GpuLimit(
            units=units,
            memory_mib=memory_limit_mib(
                units, units_per_gpu=units_per_gpu, memory_total_mib=memory
            ),
            thread_percentage=thread_percentage(units, units_per_gpu=units_per_gpu, policy=policy),
        )
        for units, memory in shares
    )
