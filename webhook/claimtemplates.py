"""Which ResourceClaimTemplates a namespace needs in DRA mode, and which can go (pure).

The webhook's DRA mode (:mod:`webhook.dra`) names a template per share shape
(``metagpu-50u-40gi``) and never creates one: admission must stay free of side
effects (``sideEffects: None``, dry runs, a denial after us). This plans what
the controller (:mod:`webhook.claimtemplate_controller`) writes.

Why the templates follow the **pods** of a namespace, not a fixed set of shapes
from the config and not the workloads:

* a fixed set would have to deny every share outside it, or be all 100 × N
  shapes in every namespace; users ask for ``0.37`` and for memory in MiB;
* a pod is what consumes a template: the controller-manager's resourceclaim
  controller makes a pod's claim from it, and retries with backoff while it
  is missing. Watching pods alone therefore makes every pod run (the first pod
  of a new shape waits for one reconcile), with one watch instead of seven
  (Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job,
  CronJob);
* a template no pod references is deleted only after ``gc_after_s`` (10 min),
  so a Deployment scaled to zero, a CronJob between runs or a rolling update
  finds its template still there; if it is gone, its next pod brings it back.

Only templates labelled ``app.kubernetes.io/managed-by: metagpu`` whose name is
one :func:`webhook.dra.parse_template_name` reads are ever deleted or
replaced; a template of that name someone else made is left alone (and its
pods get what it says).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.dra import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    Shape,
    claim_template,
    parse_template_name,
    shapes_in,
)
from webhook.model import DraSettings, Obj, as_map

GC_AFTER_S: Final = 600.0
"""How long a template no pod references is kept: longer than a rolling update or
a CronJob's gap usually takes, short enough that old shapes do not pile up."""


@dataclass(frozen=True)
class Create:
    obj: dict[str, Any]


@dataclass(frozen=True)
class Delete:
    namespace: str
    name: str
    uid: str
    why: str


Action = Create | Delete


@dataclass
class NamespacePlan:
    """What to write in one namespace, and when to look again."""

    actions: list[Action] = field(default_factory=list)
    unreferenced_since: dict[str, float] = field(default_factory=dict)
    """Our templates that no pod references, with when that was first seen."""
    recheck_in_s: float | None = None
    """When the next of them is due for deletion; None: nothing pending."""


def pod_shapes(pod: Obj, *, prefix: str) -> frozenset[Shape]:
    """The shapes of our templates a pod's ``spec.resourceClaims`` name."""
    return frozenset(shapes_in(as_map(pod.get("spec"), "spec"), prefix=prefix))


def is_ours(template: Obj, *, prefix: str) -> bool:
    meta = as_map(template.get("metadata"), "metadata")
    labels = as_map(meta.get("labels"), "metadata.labels")
    name = meta.get("name")
    return (
        labels.get(MANAGED_BY_LABEL) == MANAGED_BY
        and isinstance(name, str)
        and parse_template_name(name, prefix) is not None
    )


def plan_namespace(
    namespace: str,
    *,
    wanted: Iterable[Shape],
    templates: Iterable[Obj],
    dra: DraSettings,
    unreferenced_since: Mapping[str, float],
    now: float,
    gc_after_s: float = GC_AFTER_S,
) -> NamespacePlan:
    """Create the templates ``wanted`` lacks; delete ours unreferenced for ``gc_after_s``.

    ``templates`` are what the API holds in the namespace (any label). One of ours
    whose spec is not what its name says (edited, or the DeviceClass setting
    changed) is deleted, and created again on the next pass: a template's spec
    cannot be updated.
    """
    plan = NamespacePlan()
    by_name = {
        str(as_map(t.get("metadata")).get("name")): t
        for t in templates
        if isinstance(as_map(t.get("metadata")).get("name"), str)
    }
    wanted_names: dict[str, Shape] = {s.template_name(dra.template_prefix): s for s in wanted}
    for name, shape in sorted(wanted_names.items()):
        desired = claim_template(shape, namespace=namespace, dra=dra)
        held = by_name.get(name)
        if held is None:
            plan.actions.append(Create(desired))
        elif is_ours(held, prefix=dra.template_prefix) and held.get("spec") != desired["spec"]:
            plan.actions.append(_delete(held, namespace, "its spec is not what its name says"))
    for name, held in sorted(by_name.items()):
        if name in wanted_names or not is_ours(held, prefix=dra.template_prefix):
            continue
        since = unreferenced_since.get(name, now)
        due = since + gc_after_s
        if now >= due:
            plan.actions.append(_delete(held, namespace, "no pod has referenced it since"))
            continue
        plan.unreferenced_since[name] = since
        wait = due - now
        plan.recheck_in_s = wait if plan.recheck_in_s is None else min(plan.recheck_in_s, wait)
    return plan


def _delete(template: Obj, namespace: str, why: str) -> Delete:
    meta = as_map(template.get("metadata"))
    return Delete(namespace, str(meta.get("name")), str(meta.get("uid") or ""), why)
