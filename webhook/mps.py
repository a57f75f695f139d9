"""Rule 5 for MPS: no way around the node's MPS limits from the pod spec (pure).

The kubelet appends a container's own ``env`` after what ``Allocate`` returned, and
the container runtime keeps the last value of a name (KUBELET-FACTS §3): a pod that
sets an MPS variable itself replaces the plugin's. What a client can change, from
NVIDIA's MPS docs ("Appendix: Environment Variables") and what a real daemon did
(docs/benchmarks.md, "MPS"):

* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: the client's memory limit per GPU. The
  plugin sets it from the share; the pod's own value would replace it. A value
  "will only further constrain the limit set by the control daemon", whose default
  is the whole GPU, so the pod's value wins up to the whole GPU. Whether a value is
  stricter than the share needs the node's GPU size, which admission does not
  know: it is refused (or stripped), and the message says how to use less.
* ``CUDA_MPS_PIPE_DIRECTORY``: which daemon the client talks to. Another
  directory is no daemon: CUDA then runs without MPS (no limits at all), or fails
  on an ``EXCLUSIVE_PROCESS`` GPU the MPS server holds.
* ``CUDA_MPS_LOG_DIRECTORY``: the daemon's, not a client's; nothing to set.
* ``CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING``: lets each context
  of a client take its own ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; refused under
  ``fixed``, where one cap per container is the promise.
* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: checked with the compute policy
  (:func:`webhook.environment.add_policy_env`): under ``fixed`` only a stricter cap
  is kept; under ``balance``/``none`` any cap of its own is stricter than none.
* ``CUDA_MPS_CLIENT_PRIORITY`` (0 normal, 1 below normal) can only lower the
  client's own priority: allowed.

A ``hostPath`` volume of the pipe directory (or of a directory above it) would let
a container reach the daemon's control socket itself. The daemon refuses changes to
its settings from any user but the one that started it or root ("Insufficient
privileges for UID 65534", measured), but a root container could change every
client's defaults or ``quit`` the daemon: such pods are refused. Removing a volume
would break the pod's mounts, so this is never stripped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, Final

from plugin.api.resources import ENV_MPS_PINNED_DEVICE_MEM_LIMIT, ENV_MPS_PIPE_DIRECTORY
from webhook.config import ComputePolicy
from webhook.environment import EnvEdit, refuse_or_strip
from webhook.model import Findings, RuleSettings, as_list, as_map

ENV_MPS_LOG_DIRECTORY: Final = "CUDA_MPS_LOG_DIRECTORY"
ENV_MPS_PER_CONTEXT_PARTITIONING: Final = (
    "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING"
)

_WHY: Final[Mapping[str, str]] = {
    ENV_MPS_PINNED_DEVICE_MEM_LIMIT: (
        "metagpu sets the MPS memory limit from the container's share of each GPU; a "
        "value of its own would replace it (to use less, limit memory in the framework, "
        "e.g. torch.cuda.set_per_process_memory_fraction)"
    ),
    ENV_MPS_PIPE_DIRECTORY: (
        "metagpu points MPS clients at the node's supervised MPS daemon; another "
        "directory would run CUDA without the MPS limits"
    ),
    ENV_MPS_LOG_DIRECTORY: "the MPS log directory belongs to the node's MPS daemon",
}
"""Variables no metagpu container may set, and why (the denial's message)."""


def check_mps_env(
    edit: EnvEdit,
    *,
    policy: ComputePolicy | None,
    settings: RuleSettings,
    findings: Findings,
    may_strip: bool,
) -> None:
    """Rule 5 (MPS) for a container that gets metagpu units."""
    if not edit.index:
        return
    for var, why in _WHY.items():
        for i, item in edit.get(var):
            refuse_or_strip(
                edit,
                index=i,
                var=var,
                item=item,
                why=why,
                settings=settings,
                findings=findings,
                may_strip=may_strip,
            )
    if policy == "fixed":
        for i, item in edit.get(ENV_MPS_PER_CONTEXT_PARTITIONING):
            refuse_or_strip(
                edit,
                index=i,
                var=ENV_MPS_PER_CONTEXT_PARTITIONING,
                item=item,
                why=(
                    "its compute policy is fixed, one SM cap per container, and this lets "
                    "each CUDA context choose its own"
                ),
                settings=settings,
                findings=findings,
                may_strip=may_strip,
            )


def _aliases(path: PurePosixPath) -> set[PurePosixPath]:
    """``/var/run`` is a link to ``/run`` on current distributions: both name one place."""
    out = {path}
    for a, b in (("/var/run", "/run"), ("/run", "/var/run")):
        base = PurePosixPath(a)
        if path == base or base in path.parents:
            out.add(PurePosixPath(b) / path.relative_to(base))
    return out


def exposes(host_path: str, protected: str) -> bool:
    """Whether mounting ``host_path`` exposes ``protected``: it is that directory, one
    inside it, or one above it."""
    try:
        mounted = PurePosixPath(host_path)
    except (TypeError, ValueError):
        return False
    if not mounted.is_absolute():
        return False
    for p in _aliases(PurePosixPath(protected)):
        for m in _aliases(mounted):
            if m == p or m in p.parents or p in m.parents:
                return True
    return False


def check_mps_volumes(
    spec: Mapping[str, Any], *, settings: RuleSettings, findings: Findings
) -> None:
    """Deny a pod that uses metagpu and mounts the MPS pipe directory from the host."""
    protected = settings.mps_host_directories
    if not protected:
        return
    for i, volume in enumerate(as_list(spec.get("volumes"), "spec.volumes")):
        if not isinstance(volume, Mapping):
            continue
        host = as_map(volume.get("hostPath"), f"spec.volumes[{i}].hostPath")
        path = host.get("path")
        if not isinstance(path, str):
            continue
        hit = next((d for d in protected if exposes(path, d)), None)
        if hit is not None:
            findings.deny(
                f"volume {volume.get('name')!r} mounts hostPath {path} but the pod uses "
                f"metagpu and {hit} holds the node's MPS daemon pipes: a container with "
                "them could change or stop every client's MPS limits. Remove the volume "
                "(metagpu mounts what an MPS client needs)",
                "Forbidden",
            )
