"""The MPS control daemon's command interface and the supervisor's decisions (pure).

What the daemon understands is NVIDIA's documented interface (``man
nvidia-cuda-mps-control``; "Legacy MPS v2 Interface" in the MPS docs):

* ``nvidia-cuda-mps-control -d`` starts the control daemon in the background; it
  creates its pipes in ``CUDA_MPS_PIPE_DIRECTORY`` and its logs in
  ``CUDA_MPS_LOG_DIRECTORY`` (``control.log``, ``server.log``), and writes its PID to
  ``<pipe dir>/nvidia-cuda-mps-control.pid``;
* ``nvidia-cuda-mps-control`` without arguments is the front end: it "keeps reading
  commands from stdin until EOF", prints each reply on stdout, prints an error
  message for a rejected command (exit status still 0), and exits non-zero "if the
  daemon is not found or connection to the daemon is broken unexpectedly";
* ``get_server_list``: the PIDs of the running MPS servers, one per line (none
  before the first client);
* ``set_default_active_thread_percentage <pct>`` / ``get_default_active_thread_percentage``;
* ``set_default_device_pinned_mem_limit <dev> <value>`` and
  ``get_default_device_pinned_mem_limit <dev>``: the value is "an integer followed
  by a qualifier, either G or M";
* both defaults "only affect the next server" and are "lost if a quit command is
  executed", so a restarted daemon must be given them again;
* ``quit``: stop the daemon and its servers.

A rejected command still exits 0, so the supervisor never trusts a ``set``: it reads
each default back with its ``get`` (:func:`check_defaults`). Replies are parsed
leniently (``100``, ``100.0``; ``81559M``, ``79G``): drivers print them differently
(one reported showing a limit of at least 1 GiB as whole GiB, rounded down).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from plugin.api.limits import (
    FULL_THREAD_PERCENTAGE,
    Enforced,
    MpsMode,
    enforced_by,
    pinned_limit_value,
)

PID_FILE_NAME: Final = "nvidia-cuda-mps-control.pid"
"""Written by the control daemon into its pipe directory (MPS docs, "Utilities and Daemons")."""

GET_SERVER_LIST: Final = "get_server_list"
"""The liveness question: cheap, answered by the control daemon itself (no server needed)."""

QUIT: Final = "quit"

MIB_PER_GIB: Final = 1024


class MpsReplyError(ValueError):
    """A reply that is not what the command answers (usually the daemon's error message)."""


@dataclass(frozen=True)
class MpsGpu:
    """One GPU the daemon serves."""

    uuid: str
    index: int
    """Its ordinal for the daemon: NVML index order, which CUDA follows with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (set in the daemon's environment)."""
    memory_mib: int


@dataclass(frozen=True)
class Default:
    """One daemon default: how to set it, how to read it back, what it must read."""

    set_command: str
    get_command: str
    expected: float
    tolerance: float
    """How far the read-back may be from ``expected`` (a driver that shows whole GiB)."""
    unit: Literal["percent", "MiB"]


def daemon_defaults(gpus: Sequence[MpsGpu]) -> list[Default]:
    """The defaults every (re)started daemon gets: the whole GPU, the ceiling each
    client's own variables lower to its share (see :mod:`plugin.api.limits`).

    Explicit rather than left unset so that the read-back proves the daemon took
    commands, and so the daemon's state is the same after every restart."""
    defaults = [
        Default(
            set_command=f"set_default_active_thread_percentage {FULL_THREAD_PERCENTAGE}",
            get_command="get_default_active_thread_percentage",
            expected=FULL_THREAD_PERCENTAGE,
            tolerance=0.5,
            unit="percent",
        )
    ]
    for gpu in gpus:
        if gpu.memory_mib <= 0:
            continue  # discovery could not size it; it is withdrawn anyway
        defaults.append(
            Default(
                set_command=(
                    f"set_default_device_pinned_mem_limit {gpu.index} "
                    f"{pinned_limit_value(gpu.memory_mib)}"
                ),
                get_command=f"get_default_device_pinned_mem_limit {gpu.index}",
                expected=gpu.memory_mib,
                tolerance=MIB_PER_GIB,
                unit="MiB",
            )
        )
    return defaults


_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([MG])B?\s*$", re.IGNORECASE)


def parse_server_list(reply: str) -> tuple[int, ...]:
    """PIDs, one per line; empty before the first client. Anything else is an error."""
    pids: list[int] = []
    for line in reply.splitlines():
        text = line.strip()
        if not text:
            continue
        if not text.isdigit():
            raise MpsReplyError(f"not a server list: {reply.strip()[:200]!r}")
        pids.append(int(text))
    return tuple(pids)


def parse_value(reply: str, unit: Literal["percent", "MiB"]) -> float:
    """A ``get_default_*`` reply as a number (percent, or MiB)."""
    text = reply.strip().splitlines()[-1] if reply.strip() else ""
    if unit == "percent":
        m = _NUMBER.match(text)
        if m is None:
            raise MpsReplyError(f"not a percentage: {reply.strip()[:200]!r}")
        return float(m.group(1))
    m = _MEMORY.match(text)
    if m is None:
        raise MpsReplyError(f"not a memory limit: {reply.strip()[:200]!r}")
    value = float(m.group(1))
    return value * MIB_PER_GIB if m.group(2).upper() == "G" else value


def check_default(default: Default, reply: str) -> str | None:
    """None when the read-back matches; otherwise why not (for the log and the reason)."""
    try:
        value = parse_value(reply, default.unit)
    except MpsReplyError as exc:
        return f"{default.set_command!r} did not take: {exc}"
    if abs(value - default.expected) > default.tolerance:
        return (
            f"{default.set_command!r} did not take: {default.get_command!r} answers "
            f"{reply.strip()[:100]!r}"
        )
    return None


@dataclass(frozen=True)
class Backoff:
    """Restart delays: ``initial_s``, doubled per consecutive failure, at most ``max_s``."""

    initial_s: float
    max_s: float

    def delay(self, failures: int) -> float:
        """The wait before the next start after ``failures`` consecutive failed runs (>= 1)."""
        exponent = min(max(failures - 1, 0), 32)
        return float(min(self.max_s, self.initial_s * (2**exponent)))


MpsState = Literal["starting", "up", "down", "stopped"]


@dataclass(frozen=True)
class MpsStatus:
    """The supervised daemon as the plugin, the board file and the agent show it."""

    state: MpsState
    reason: str = ""
    """Why it is not up (empty while up)."""
    restarts: int = 0
    """Starts after the first, since the plugin started."""
    since: float = 0.0
    """Wall-clock time (Unix seconds) of the last state change."""
    server_pids: tuple[int, ...] = ()
    """The MPS servers at the last ask."""


@dataclass(frozen=True)
class MpsNode:
    """The node's MPS as the board file publishes it for the node agent (labels,
    ledger, metrics, mgctl): how the plugin serves MPS and, when it supervises the
    daemon, the daemon's status."""

    mode: MpsMode = "off"
    status: MpsStatus | None = None
    """The supervised daemon (None unless ``mode`` is ``supervised``)."""

    @property
    def enforces(self) -> tuple[Enforced, ...]:
        """What containers this node admits are held to. A stopped daemon (the plugin
        exiting, or reloading into another MPS setting) no longer withdraws its GPUs
        and has restored their compute mode: nothing."""
        if self.status is not None and self.status.state == "stopped":
            return ()
        return enforced_by(self.mode)


def down_reason(detail: str, *, retry_in_s: float | None) -> str:
    """The reason a GPU of an MPS node is not offered while its daemon is down."""
    tail = f"; restarting in {retry_in_s:g}s" if retry_in_s is not None else ""
    return (
        f"MPS control daemon not answering ({detail}): new containers would get no "
        f"memory or compute limits{tail}"
    )
