"""Rules 4 and 5 inside containers: the policy variables, and which GPUs a container may see.

* Rule 4: every metagpu container gets ``METAGPU_COMPUTE_POLICY``; under
  ``fixed`` also ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = its share.
* Rule 5: a metagpu container may not choose its own GPUs
  (``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES``) nor be privileged;
  a container without a GPU under the nvidia runtime class gets
  ``NVIDIA_VISIBLE_DEVICES=void``, because CUDA base images set ``all`` and the
  nvidia runtime would expose every GPU on the node to a sidecar.

Values users set are kept unless they defeat the GPU isolation, in which case
``visible_devices_policy`` decides between denying the pod and stripping the
variable (with a warning). ``envFrom`` sources cannot be inspected here; an
explicit ``env`` entry, which is what this module adds, overrides them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from plugin.api.limits import share_percent
from plugin.api.resources import (
    ENV_COMPUTE_POLICY,
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_MPS_THREAD_PERCENTAGE,
    ENV_NVIDIA_VISIBLE_DEVICES,
    VISIBLE_DEVICES_VOID,
)
from webhook.config import ComputePolicy
from webhook.model import Container, Findings, PatchOperation, RuleSettings, add_op, as_list, as_map

VISIBLE_DEVICE_VARS: Final = (ENV_NVIDIA_VISIBLE_DEVICES, ENV_CUDA_VISIBLE_DEVICES)
NO_GPU_VALUES: Final = frozenset({VISIBLE_DEVICES_VOID, "none", ""})
"""``NVIDIA_VISIBLE_DEVICES`` values under which the nvidia runtime exposes no GPU."""

EnvItem = Mapping[str, Any]


@dataclass(slots=True)
class EnvEdit:
    """The env of one container, read once, and the edits the rules make to it.

    Removals are by index and applied first (highest index first, so the
    others stay valid), then additions are appended: the API server applies
    the operations in order.
    """

    container: Container
    present: bool
    """False when ``env`` is missing or null: the first addition creates the list."""
    index: dict[str, list[tuple[int, EnvItem]]]
    remove: list[int] = field(default_factory=list)
    add: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, c: Container) -> EnvEdit:
        env = c.obj.get("env")
        index: dict[str, list[tuple[int, EnvItem]]] = {}
        if env is None:  # most GPU containers
            return cls(c, False, index)
        for i, item in enumerate(as_list(env, c.label, " env")):
            if isinstance(item, Mapping):
                name = item.get("name")
                if isinstance(name, str):
                    index.setdefault(name, []).append((i, item))
        return cls(c, True, index)

    def get(self, name: str) -> Sequence[tuple[int, EnvItem]]:
        return self.index.get(name, ())

    def ops(self) -> list[PatchOperation]:
        if not self.remove and not self.add:
            return []
        path = self.container.path + "/env"
        out: list[PatchOperation] = [
            {"op": "remove", "path": f"{path}/{i}"} for i in sorted(set(self.remove), reverse=True)
        ]
        if self.add:
            if self.present:
                out.extend(add_op(path + "/-", item) for item in self.add)
            else:
                out.append(add_op(path, list(self.add)))
        return out


def shown(var: str, item: EnvItem) -> str:
    """``NVIDIA_VISIBLE_DEVICES=all``, or ``... (from valueFrom)`` when the value is indirect."""
    if "valueFrom" in item and item.get("value") is None:
        return f"{var} (from valueFrom)"
    return f"{var}={item.get('value') or ''}"


def hides_gpus(item: EnvItem) -> bool:
    """True for ``NVIDIA_VISIBLE_DEVICES`` values that expose no GPU (void, none, empty)."""
    return "valueFrom" not in item and (item.get("value") or "") in NO_GPU_VALUES


def check_gpu_container(
    edit: EnvEdit, *, resource: str, settings: RuleSettings, findings: Findings, may_strip: bool
) -> None:
    """Rule 5 for a container that gets metagpu: not privileged, no own GPU choice."""
    c = edit.container
    if settings.deny_privileged:
        security = as_map(c.obj.get("securityContext"), c.label, " securityContext")
        if security.get("privileged") is True:
            findings.deny(
                f"{c.label} is privileged and requests {resource}; a privileged container "
                "sees every GPU on the node: remove securityContext.privileged, or ask for "
                "whole GPUs",
                "Forbidden",
            )
    if not edit.index:
        return  # no env of its own: nothing to refuse
    why = f"it requests {resource} and metagpu chooses the GPU it sees"
    for var in VISIBLE_DEVICE_VARS:
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


def check_no_gpu_container(
    edit: EnvEdit, *, settings: RuleSettings, findings: Findings, may_strip: bool
) -> None:
    """Rule 5 for a container without a GPU in a pod that uses metagpu.

    Only ``NVIDIA_VISIBLE_DEVICES`` can expose a GPU to it (``CUDA_VISIBLE_DEVICES``
    only narrows what the runtime exposed); ``void``/``none`` are fine. A
    stripped value is replaced by ``void``.
    """
    why = "the pod uses metagpu and this container was given no GPU"
    stripped = False
    for i, item in edit.get(ENV_NVIDIA_VISIBLE_DEVICES):
        if not hides_gpus(item):
            stripped |= refuse_or_strip(
                edit,
                index=i,
                var=ENV_NVIDIA_VISIBLE_DEVICES,
                item=item,
                why=why,
                settings=settings,
                findings=findings,
                may_strip=may_strip,
            )
    if stripped:
        edit.add.append({"name": ENV_NVIDIA_VISIBLE_DEVICES, "value": VISIBLE_DEVICES_VOID})


def void_no_gpu_container(
    edit: EnvEdit, *, settings: RuleSettings, findings: Findings, pod_uses_metagpu: bool
) -> None:
    """Rule 5 for a container without a GPU under the nvidia runtime: it sees no GPU.

    A value the user set is kept unless it exposes GPUs in a pod that uses
    metagpu (then :func:`check_no_gpu_container` decides); in other pods it is
    kept with a warning, since that pod is not ours.
    """
    items = edit.get(ENV_NVIDIA_VISIBLE_DEVICES)
    if not items:
        edit.add.append({"name": ENV_NVIDIA_VISIBLE_DEVICES, "value": VISIBLE_DEVICES_VOID})
        return
    exposing = [item for _, item in items if not hides_gpus(item)]
    if not exposing:
        return
    if pod_uses_metagpu:
        check_no_gpu_container(edit, settings=settings, findings=findings, may_strip=True)
        return
    findings.warn(
        f"{edit.container.label} asks for no GPU but sets "
        f"{shown(ENV_NVIDIA_VISIBLE_DEVICES, exposing[-1])} under runtime class "
        f"{settings.void_runtime_class!r}; it may see GPUs that other pods were given"
    )


def add_policy_env(
    edit: EnvEdit, *, units: int, policy: ComputePolicy, settings: RuleSettings, findings: Findings
) -> None:
    """Rule 4 inside one GPU container: the policy variable, and the MPS cap for ``fixed``.

    Under ``fixed`` a cap the user set is kept when it is stricter than the
    share and denied when it is looser: ``fixed`` is a hard cap.
    """
    c = edit.container
    current = edit.get(ENV_COMPUTE_POLICY)
    if not current:
        edit.add.append({"name": ENV_COMPUTE_POLICY, "value": policy})
    elif current[-1][1].get("value") != policy:
        findings.warn(
            f"{c.label} sets {shown(ENV_COMPUTE_POLICY, current[-1][1])} but the pod's "
            f"compute policy is {policy!r}; enforcement follows the policy"
        )
    if policy != "fixed":
        return
    share = share_percent(units, settings.units_per_gpu)
    cap = edit.get(ENV_MPS_THREAD_PERCENTAGE)
    if not cap:
        edit.add.append({"name": ENV_MPS_THREAD_PERCENTAGE, "value": str(share)})
        return
    item = cap[-1][1]
    try:
        given = float(item.get("value") or "")
    except (ValueError, TypeError, OverflowError):  # not a number, not a string, beyond a float
        given = math.nan
    if not 0 < given <= share:
        findings.deny(
            f"{c.label} sets {shown(ENV_MPS_THREAD_PERCENTAGE, item)} but its fixed share is "
            f"{share}% of a GPU: remove it, or set a number from 1 to {share}",
            "Forbidden",
        )


def refuse_or_strip(
    edit: EnvEdit,
    *,
    index: int,
    var: str,
    item: EnvItem,
    why: str,
    settings: RuleSettings,
    findings: Findings,
    may_strip: bool,
) -> bool:
    """Strip the variable (True) or record a denial (False), per ``visible_devices_policy``.

    Shared by every env rule that removes a variable the pod may not set (GPU
    choice here, MPS limits in :mod:`webhook.mps`): one setting, one behaviour."""
    c = edit.container
    if settings.visible_devices_policy == "strip" and may_strip:
        edit.remove.append(index)
        findings.warn(f"{c.label}: removed {shown(var, item)} ({why})")
        return True
    tail = (
        "; the pod opted out of mutation, so it cannot be removed for you"
        if settings.visible_devices_policy == "strip"
        else ""
    )
    findings.deny(
        f"{c.label} sets {shown(var, item)} but {why}: remove {var} from its env{tail}", "Forbidden"
    )
    return False
