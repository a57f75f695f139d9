"""Whether a namespace's quotas count metagpu units, and the warning when they do not (pure).

The admission side of the quota mirror: the webhook cannot stop a pod that
a GPU quota no longer counts (quota admission is the API server's), but it
can say so at the moment it converts one, so a platform team learns that a
namespace's GPU budget does not hold before the bill does.

In DRA mode the share is a ResourceClaim: neither a GPU nor a units quota counts it,
only the DeviceClass's ``devices`` key does (one per share, whatever its size), so the
warning names that key instead (:func:`uncounted_claims_warning`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from plugin.api.resources import NVIDIA_GPU_RESOURCE
from webhook.model import Decision, Mutation, RuleSettings, escape_pointer
from webhook.quotas.mirror import GPU_KEYS, MirrorSettings, Obj, hard_of

QuotaKind = Literal["gpus", "units", "both", "devices"]
"""What one quota limits: whole GPUs, the metagpu resource, or both; in DRA mode,
``devices`` for a quota on the claims' DeviceClass (it counts the shares, whatever
else it limits)."""

MAX_NAME_CHARS: Final = 30
"""A quota name is cut to this in the warning: the API server truncates a warning
past 256 characters (:data:`webhook.review.MAX_WARNING_CHARS`), and the advice
matters more than the end of a long name."""


def kind_of(quota: Obj, settings: MirrorSettings) -> QuotaKind | None:
    """What ``quota`` limits of interest here, or None (it is not kept in the cache)."""
    keys = hard_of(quota).keys()
    if settings.devices_key is not None and settings.devices_key in keys:
        return "devices"
    gpus = any(k in GPU_KEYS for k in keys)
    units = any(settings.names_resource(k) for k in keys)
    if gpus and units:
        return "both"
    if gpus:
        return "gpus"
    if units:
        return "units"
    return None


@dataclass(frozen=True)
class NamespaceQuotas:
    """The quotas of one namespace that limit GPUs or units, by name."""

    kinds: dict[str, QuotaKind]

    def unmirrored(self) -> list[str]:
        """The GPU quotas, when no quota of the namespace limits the metagpu resource."""
        if any(k in ("units", "both") for k in self.kinds.values()):
            return []
        return sorted(n for n, k in self.kinds.items() if k == "gpus")

    def uncounted_claims(self) -> list[str]:
        """DRA mode: the GPU and unit quotas, when no quota counts the claims' devices."""
        if any(k == "devices" for k in self.kinds.values()):
            return []
        return sorted(n for n, k in self.kinds.items() if k != "devices")


def unmirrored_warning(quotas: Iterable[str], settings: MirrorSettings) -> str:
    """What the AdmissionResponse says when GPU quotas do not count units.

    The API server cuts a warning at 256 characters: the namespace is left out
    (the user is applying to it) and a long quota name is cut, so the quota,
    what it misses and the two ways to fix it always fit.
    """
    names = list(quotas)
    first = names[0] if names else ""
    if len(first) > MAX_NAME_CHARS:
        first = first[: MAX_NAME_CHARS - 3] + "..."
    more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
    resource = settings.resource_name
    return (
        f'ResourceQuota "{first}"{more} limits {NVIDIA_GPU_RESOURCE} but not {resource} in '
        "this namespace; these units are not counted. Fix: quotaMirror.enabled=true, or "
        f"requests.{resource} ({settings.units_per_gpu}/GPU) in a quota (docs/quotas.md)"
    )


def uncounted_claims_warning(quotas: Iterable[str], settings: MirrorSettings) -> str:
    """What the AdmissionResponse says in DRA mode when GPU or unit quotas cannot count
    the claims (cut to fit the API server's 256 characters, as above)."""
    names = list(quotas)
    first = names[0] if names else ""
    if len(first) > MAX_NAME_CHARS:
        first = first[: MAX_NAME_CHARS - 3] + "..."
    more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
    return (
        f'ResourceQuota "{first}"{more} limits GPUs or units, which DRA claims do not use; '
        f"these shares are not counted. Fix: {settings.devices_key} (shares at once) in a "
        "quota (docs/quotas.md)"
    )


# ------------------------------------------------------- which objects hear it
def with_unit_warnings(
    decision: Decision, obj: object, *, settings: RuleSettings, warnings: tuple[str, ...]
) -> Decision:
    """``decision`` with ``warnings`` added when the object it admits asks for units
    (in DRA mode: holds one of our claims).

    A whole-GPU pod in the same namespace (its ``nvidia.com/gpu`` *is* counted)
    or a pod without a GPU hears nothing; nor does a denied one (not admitted).
    """
    if not isinstance(decision, Mutation):
        return decision
    asks = asks_for_claims if settings.dra is not None else asks_for_units
    if not asks(obj, decision, settings):
        return decision
    return Mutation(
        patch=decision.patch, warnings=tuple(dict.fromkeys((*decision.warnings, *warnings)))
    )


def asks_for_units(obj: object, decision: Mutation, settings: RuleSettings) -> bool:
    """The patch writes a metagpu resource, or the object's containers already ask for one."""
    tokens = {escape_pointer(name) for name in settings.metagpu_resources}
    for op in decision.patch:
        if op["op"] == "remove" or "/resources" not in op["path"]:
            continue
        if op["path"].rpartition("/")[2] in tokens or _names(op.get("value"), settings):
            return True
    spec = _pod_spec(obj)
    for key in ("containers", "initContainers"):
        listed = spec.get(key)
        for container in listed if isinstance(listed, list) else ():
            if isinstance(container, Mapping) and _names(container.get("resources"), settings):
                return True
    return False


def asks_for_claims(obj: object, decision: Mutation, settings: RuleSettings) -> bool:
    """DRA mode: the patch writes pod-level claims, or the object already holds ours."""
    if any(op["op"] != "remove" and "/resourceClaims" in op["path"] for op in decision.patch):
        return True
    assert settings.dra is not None
    prefix = settings.dra.template_prefix + "-"
    listed = _pod_spec(obj).get("resourceClaims")
    for entry in listed if isinstance(listed, list) else ():
        if isinstance(entry, Mapping):
            template = entry.get("resourceClaimTemplateName")
            if isinstance(template, str) and template.startswith(prefix):
                return True
    return False


def _pod_spec(obj: object) -> Mapping[str, Any]:
    """A Pod's spec, or a workload's pod template spec (a CronJob's is one level deeper)."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping):
        return {}
    if "containers" in spec:
        return spec
    for path in (("template", "spec"), ("jobTemplate", "spec", "template", "spec")):
        node: Any = spec
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            return node
    return {}


def _names(value: Any, settings: RuleSettings) -> bool:
    """A metagpu resource is a key of ``value`` (``limits``) or of a map in it (``resources``)."""
    if not isinstance(value, Mapping):
        return False
    return any(k in settings.metagpu_resources for k in value) or any(
        isinstance(v, Mapping) and any(k in settings.metagpu_resources for k in v)
        for v in value.values()
    )
