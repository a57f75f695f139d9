"""Who is calling the agent: the kernel's word, not a token.

The mgctl socket gives the agent the caller's PID and UID through
``SO_PEERCRED`` (filled in by the kernel at ``connect()``; a process cannot
claim another's). The agent runs with ``hostPID``, so the PID is a host PID,
and the PID's cgroup names its container (:mod:`plugin.agent.cgroups`). Then:

* a process in a container that a pod on this node runs → **container scope**:
  it sees its own processes and shares and may kill only its own processes;
* a root process (UID 0) on the host, outside any container and any pod's
  cgroup, or in the agent's own container (``kubectl exec`` into the agent:
  the very cgroup the agent runs in, not merely one named after it) →
  **node scope**: everything;
* a host process of the agent's own UID, when the agent does not run as root
  (``metagpu dev`` on a workstation) → **node scope** too: that user can
  already read and signal the agent and everything the agent may signal, so
  this grants nothing new (on a node the agent is root, and this is the rule
  above);
* anything else → refused, with the reason.

The original MetaGPU used a JWT signed with a secret committed in its chart:
anyone holding any container's token could kill any host PID. There is no
secret here to leak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from plugin.agent.cgroups import (
    CgroupFormatError,
    ContainerId,
    ProcessGoneError,
    pick_container,
    read_process_cgroup,
    short_id,
)
from plugin.agent.containers import ContainerRef

Scope = Literal["node", "container"]


class CallerRefusedError(Exception):
    """The caller may not use the agent; ``str()`` says why, for the caller to read."""


@dataclass(frozen=True)
class Caller:
    """An identified caller and what it may see."""

    pid: int
    uid: int
    scope: Scope
    container: ContainerRef | None
    """The caller's container in container scope; None in node scope."""
    via: str
    """How node scope was granted (``host root``, ``agent container``), for logs."""

    def describe(self) -> str:
        """``pod ml/train-0 container trainer (PID 4242)`` or ``host root (PID 1234)``."""
        if self.container is not None:
            k = self.container.key
            return f"pod {k.namespace}/{k.pod} container {k.container} (PID {self.pid})"
        return f"{self.via} (PID {self.pid})"


def identify(
    pid: int,
    uid: int,
    *,
    proc_root: Path,
    lookup: Callable[[ContainerId], ContainerRef | None],
    agent_cgroup: str | None,
    node_name: str | None,
    pods_problem: str | None = None,
    agent_uid: int | None = None,
) -> Caller:
    """Decide the caller's scope from its peer credentials. Raises :class:`CallerRefusedError`.

    ``agent_cgroup`` is the cgroup path of the agent's own container (None
    when the agent runs on the host); ``pods_problem`` explains why the pod
    index may be incomplete, so a refusal can say so. ``agent_uid`` is the
    agent's own UID (None: only root on the host has node scope).
    """
    if pid <= 0:
        raise CallerRefusedError(
            "the agent cannot see the calling process (no PID in its PID namespace); "
            "the agent must run with hostPID"
        )
    try:
        cgroup = read_process_cgroup(pid, proc_root=proc_root)
    except ProcessGoneError as exc:
        raise CallerRefusedError(
            f"calling process {pid} exited before it could be identified"
        ) from exc
    except CgroupFormatError as exc:
        raise CallerRefusedError(f"cannot tell which container PID {pid} runs in: {exc}") from exc

    cid = pick_container(cgroup, known=lambda c: lookup(c) is not None)
    if cid is None:
        if cgroup.in_pod:
            # Inside a pod's cgroup but no container ID we can read (an unknown
            # runtime's naming, a process attached at the pod level): never treat
            # that as the host, or root in any container would see the node.
            raise CallerRefusedError(
                f"PID {pid} runs in a pod's cgroup ({cgroup.path}) but its container cannot "
                "be identified; refusing rather than guessing"
            )
        if uid == 0:
            return Caller(pid=pid, uid=uid, scope="node", container=None, via="host root")
        if agent_uid is not None and uid == agent_uid:
            return Caller(pid=pid, uid=uid, scope="node", container=None, via="the agent's user")
        raise CallerRefusedError(
            f"PID {pid} is a host process running as UID {uid}, not in a pod's container; "
            "only root on the host (or a pod's own containers) may use the agent"
        )
    if agent_cgroup is not None and cgroup.path == agent_cgroup and uid == 0:
        # The same cgroup, not merely the same container ID: a root process that can
        # write cgroupfs may create a sub-cgroup named after the agent's container
        # (picked when no outer container is known yet), but cannot enter this one.
        return Caller(pid=pid, uid=uid, scope="node", container=None, via="agent container")
    ref = lookup(cid)
    if ref is None:
        where = f"node {node_name}" if node_name else "this node"
        why = f" (the pod list is incomplete: {pods_problem})" if pods_problem else ""
        raise CallerRefusedError(
            f"PID {pid} runs in container {short_id(cid)}, which is not a container of any pod "
            f"on {where} that the agent knows{why}"
        )
    return Caller(pid=pid, uid=uid, scope="container", container=ref, via="pod container")
