"""What the quota mirror wants: a source ResourceQuota in, its companion out (pure).

After conversion a pod asks for ``cnvrg.io/metagpu`` units, which a
namespace's ``requests.nvidia.com/gpu`` quota does not count. For every
ResourceQuota that limits ``nvidia.com/gpu`` and not the metagpu resource, the
mirror keeps a *companion* ResourceQuota in the same namespace with the same
budget in units (GPUs × ``units_per_gpu``), the same ``scopes`` and
``scopeSelector``, owned by the source (``ownerReferences``, ``controller:
true``) so the garbage collector removes it with the source, and labelled as
ours so that a quota we did not write is never touched.

Which keys count (Kubernetes' pod quota evaluator, ``isExtendedResourceNameForQuota``
and the "Quota for extended resources" section of the ResourceQuota docs):
for an extended resource only ``requests.<name>`` is counted, because
extended resources cannot be overcommitted. ``limits.<name>`` and the bare
``<name>`` pass validation (any name with a ``/`` does) but are never
counted. The mirror reads ``requests.nvidia.com/gpu`` and, as the same
intent, ``limits.nvidia.com/gpu`` (the smaller wins when both are set), and
always writes ``requests.<metagpu resource>``, the one key that counts.

A quota that already names the metagpu resource in any form is left alone:
the operator chose its unit budget. Everything here works on plain dicts as
the API server sends them; :mod:`webhook.quotas.controller` does the I/O.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from plugin.api.quantity import QuantityError, parse_quantity
from plugin.api.resources import NVIDIA_GPU_RESOURCE

Obj = Mapping[str, Any]

LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "metagpu-quota-mirror"
"""``app.kubernetes.io/managed-by`` on every companion: the mark that makes it ours."""

ANNOTATION_MIRROR_OF: Final = "metagpu.io/quota-mirror-of"
"""The source quota's name, for people (``kubectl describe``); the owner reference
is what the mirror itself trusts."""

COMPANION_SUFFIX: Final = "-metagpu"
MAX_NAME_LEN: Final = 253
"""A ResourceQuota name is a DNS subdomain."""

REQUESTS: Final = "requests."
LIMITS: Final = "limits."
DEVICES_SUFFIX: Final = ".deviceclass.resource.k8s.io/devices"
"""The ResourceClaim quota evaluator's per-DeviceClass key (devices requested by claims)."""
GPU_KEYS: Final = (REQUESTS + NVIDIA_GPU_RESOURCE, LIMITS + NVIDIA_GPU_RESOURCE)
"""The source keys read as a whole-GPU budget (see the module docstring)."""


@dataclass(frozen=True)
class MirrorSettings:
    """The two numbers a companion depends on, from the webhook's config."""

    resource_name: str
    """The metagpu resource the webhook converts fractions into."""
    units_per_gpu: int
    claim_device_class: str | None = None
    """With ``mode: dra``, the DeviceClass the webhook's claims name: shares are then
    counted by its ``<class>.deviceclass.resource.k8s.io/devices`` quota key, not by
    units (docs/quotas.md, "DRA mode")."""

    @property
    def devices_key(self) -> str | None:
        """The quota key that counts DRA-mode shares, or None in device-plugin mode."""
        if self.claim_device_class is None:
            return None
        return f"{self.claim_device_class}{DEVICES_SUFFIX}"

    @property
    def unit_key(self) -> str:
        return REQUESTS + self.resource_name

    def names_resource(self, key: str) -> bool:
        """Whether a quota key limits the metagpu resource, in any of its forms."""
        return key in (
            self.resource_name,
            REQUESTS + self.resource_name,
            LIMITS + self.resource_name,
        )


# ------------------------------------------------------------------ reading
def meta_of(quota: Obj) -> Obj:
    meta = quota.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def key_of(quota: Obj) -> tuple[str, str]:
    """``(namespace, name)``; empty strings where the object lacks them."""
    meta = meta_of(quota)
    namespace, name = meta.get("namespace"), meta.get("name")
    return (
        namespace if isinstance(namespace, str) else "",
        name if isinstance(name, str) else "",
    )


def hard_of(quota: Obj) -> Obj:
    spec = quota.get("spec")
    hard = spec.get("hard") if isinstance(spec, Mapping) else None
    return hard if isinstance(hard, Mapping) else {}


def is_companion(quota: Obj) -> bool:
    """Carries our managed-by label (we wrote it, or someone copied our mark)."""
    labels = meta_of(quota).get("labels")
    return isinstance(labels, Mapping) and labels.get(LABEL_MANAGED_BY) == MANAGED_BY


def gpu_budget(quota: Obj) -> Decimal | None:
    """The whole-GPU budget a quota sets (the smaller of its GPU keys), or None."""
    hard = hard_of(quota)
    values: list[Decimal] = []
    for key in GPU_KEYS:
        if key in hard:
            try:
                values.append(parse_quantity(hard[key]))
            except QuantityError:
                continue  # the API server validates quantities; never seen in practice
    return min(values) if values else None


def limits_resource(quota: Obj, settings: MirrorSettings) -> bool:
    """The quota names the metagpu resource itself: the operator's own unit budget."""
    return any(settings.names_resource(key) for key in hard_of(quota))


def is_source(quota: Obj, settings: MirrorSettings) -> bool:
    """A quota the mirror keeps a companion for."""
    return (
        not is_companion(quota)
        and gpu_budget(quota) is not None
        and not limits_resource(quota, settings)
    )


def companion_name(source_name: str) -> str:
    """``<source>-metagpu``; a name too long for that is shortened with a hash of it."""
    name = source_name + COMPANION_SUFFIX
    if len(name) <= MAX_NAME_LEN:
        return name
    digest = hashlib.sha256(source_name.encode()).hexdigest()[:8]
    keep = MAX_NAME_LEN - len(COMPANION_SUFFIX) - len(digest) - 1
    return f"{source_name[:keep].rstrip('.-')}-{digest}{COMPANION_SUFFIX}"


# ------------------------------------------------------------------ desired
def desired_companion(source: Obj, settings: MirrorSettings) -> dict[str, Any] | None:
    """The companion ``source`` should have, or None when it should have none.

    Units are rounded down: a budget of 0.5 GPU at 3 units per GPU is 1 unit,
    never more than the operator allowed.
    """
    if not is_source(source, settings):
        return None
    meta = meta_of(source)
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    if not (isinstance(name, str) and isinstance(namespace, str) and isinstance(uid, str)):
        return None
    budget = gpu_budget(source)
    assert budget is not None  # is_source
    units = max(math.floor(budget * settings.units_per_gpu), 0)
    spec: dict[str, Any] = {"hard": {settings.unit_key: str(units)}}
    source_spec = source.get("spec")
    if isinstance(source_spec, Mapping):
        for key in ("scopes", "scopeSelector"):
            if source_spec.get(key):
                spec[key] = copy.deepcopy(source_spec[key])
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": companion_name(name),
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {ANNOTATION_MIRROR_OF: name},
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": spec,
    }


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    """``controller: true`` and no ``blockOwnerDeletion``: setting that needs
    update rights on the owner's finalizers, and nothing waits on the companion."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "name": name,
        "uid": uid,
        "controller": True,
    }


def owned_by(quota: Obj, uid: str) -> bool:
    refs = meta_of(quota).get("ownerReferences")
    return isinstance(refs, list) and any(
        isinstance(r, Mapping) and r.get("uid") == uid and r.get("controller") is True for r in refs
    )


def matches(existing: Obj, desired: Obj) -> bool:
    """Whether ``existing`` already is ``desired`` in every field the mirror owns.

    Labels and annotations others add are kept and ignored; the owner
    references, the spec and our own label and annotation must be exact.
    """
    have, want = meta_of(existing), meta_of(desired)
    for field in ("labels", "annotations"):
        theirs = have.get(field)
        theirs = theirs if isinstance(theirs, Mapping) else {}
        if any(theirs.get(k) != v for k, v in want[field].items()):
            return False
    return have.get("ownerReferences") == want["ownerReferences"] and _spec(existing) == _spec(
        desired
    )


def _spec(quota: Obj) -> dict[str, Any]:
    spec = quota.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    return {k: spec[k] for k in ("hard", "scopes", "scopeSelector") if spec.get(k)}


def repaired(existing: Obj, desired: Obj) -> dict[str, Any]:
    """``existing`` with the mirror's fields put back (for a replace with its resourceVersion)."""
    obj = copy.deepcopy(dict(existing))
    obj.pop("status", None)  # a PUT of the main resource ignores status; leave it out
    meta = obj.setdefault("metadata", {})
    want = meta_of(desired)
    for field in ("labels", "annotations"):
        merged = dict(meta.get(field) or {})
        merged.update(want[field])
        meta[field] = merged
    meta["ownerReferences"] = copy.deepcopy(want["ownerReferences"])
    obj["spec"] = copy.deepcopy(dict(desired["spec"]))
    return obj


# --------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Create:
    obj: dict[str, Any]


@dataclass(frozen=True)
class Replace:
    obj: dict[str, Any]
    """The whole object, with the ``resourceVersion`` it replaces."""


@dataclass(frozen=True)
class Delete:
    namespace: str
    name: str
    uid: str
    """Sent as a precondition, so a quota re-created under the same name is spared."""


@dataclass(frozen=True)
class Blocked:
    """A companion cannot be written: its name is taken by a quota that is not ours."""

    namespace: str
    name: str
    source: str


Action = Create | Replace | Delete | Blocked


def plan_namespace(quotas: Iterable[Obj], settings: MirrorSettings) -> list[Action]:
    """Everything to do so that one namespace's companions match its sources.

    ``quotas`` are every ResourceQuota of the namespace as last seen. A
    companion whose source is gone, no longer limits GPUs, or now limits
    the metagpu resource itself is deleted; so is one that claims our
    label but that no current source wants.
    """
    by_name: dict[str, Obj] = {}
    for quota in quotas:
        name = meta_of(quota).get("name")
        if isinstance(name, str):
            by_name[name] = quota
    actions: list[Action] = []
    wanted: set[str] = set()
    for name, quota in sorted(by_name.items()):
        desired = desired_companion(quota, settings)
        if desired is None:
            continue
        target = desired["metadata"]["name"]
        wanted.add(target)
        existing = by_name.get(target)
        if existing is None:
            actions.append(Create(desired))
        elif not is_companion(existing) and not owned_by(existing, meta_of(quota)["uid"]):
            actions.append(Blocked(desired["metadata"]["namespace"], target, name))
        elif not matches(existing, desired):
            actions.append(Replace(repaired(existing, desired)))
    for name, quota in sorted(by_name.items()):
        if is_companion(quota) and name not in wanted:
            meta = meta_of(quota)
            actions.append(Delete(str(meta.get("namespace")), name, str(meta.get("uid"))))
    return actions
