"""The webhook's rules: a pod (or a workload's pod template) in, a patch or a denial out.

Pure: plain dicts as the API server sends them, a :class:`RuleSettings` built
once from the config, and the :class:`NamespaceFacts` the adapter looked up.
No I/O, no clock, no aiohttp, so every rule is tested on dicts and
``metagpu mutate`` applies exactly what the webhook would.

The rules (numbers as in ``docs/webhook.md``):

1. GPU fractions in ``resources`` become whole units of the metagpu resource,
   in limits *and* requests; what cannot be converted exactly is denied
   (:mod:`webhook.conversion`).
2. Pods that use metagpu get the GPU-node tolerations they lack.
3. ... and ``runtimeClassName`` when they have none.
4. ... and a compute policy: annotation, ``METAGPU_COMPUTE_POLICY``, and for
   ``fixed`` an MPS thread cap (:mod:`webhook.environment`).
5. Hardening: GPU containers may not pick their own GPUs or be privileged;
   containers without a GPU under the nvidia runtime see none
   (:mod:`webhook.environment`).
6. Everything else is left alone; ``metagpu.io/inject: "false"`` opts out.
7. Idempotent: the rules applied to their own output produce no patch, which
   is what makes ``reinvocationPolicy: IfNeeded`` safe.
8. A mutated pod records what it asked for in ``metagpu.io/original-request``.
9. Workload pod templates get rule 1, so a Deployment asking for ``0.5`` is
   not refused at the workload level before any pod exists.
10. A re-applied manifest (the fraction merged back beside the units the
    webhook wrote) is the same request: rule 1 turns it back into the stored
    object, or follows a changed fraction (:mod:`webhook.conversion`).

Patches are built operation by operation, never by diffing two documents: it
is several times faster than ``jsonpatch.make_patch``, and the operations say
exactly what changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import orjson

from plugin.api.limits import share_percent
from plugin.api.resources import (
    ANNOTATION_COMPUTE_POLICY,
    ANNOTATION_ORIGINAL_REQUEST,
    COMPUTE_POLICIES,
)
from webhook.config import ComputePolicy
from webhook.conversion import GpuPlan, check_pod_resources, plan_gpu
from webhook.environment import (
    EnvEdit,
    add_policy_env,
    check_gpu_container,
    check_no_gpu_container,
    void_no_gpu_container,
)
from webhook.model import (
    NO_NAMESPACE_FACTS,
    UNCHANGED,
    Decision,
    Denial,
    DenialReason,
    Findings,
    Mutation,
    NamespaceFacts,
    Obj,
    PatchOperation,
    PodShapeError,
    RuleSettings,
    TolerationKey,
    add_op,
    annotations_of,
    as_list,
    as_map,
    container_list,
    containers,
    escape_pointer,
    opted_out,
)
from webhook.mps import check_mps_env, check_mps_volumes

__all__ = [
    "NO_NAMESPACE_FACTS",
    "UNCHANGED",
    "WORKLOAD_TEMPLATE_PATHS",
    "Decision",
    "Denial",
    "Mutation",
    "NamespaceFacts",
    "PatchOperation",
    "PodShapeError",
    "RuleSettings",
    "mutate_ephemeral_containers",
    "mutate_pod",
    "mutate_pod_update",
    "mutate_workload",
    "share_percent",
]

WORKLOAD_TEMPLATE_PATHS: Final[dict[tuple[str, str], tuple[str, ...]]] = {
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("", "ReplicationController"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}
"""Where each workload kind keeps its pod template (rule 9), by (group, kind)."""


CLAIMED: Final = "a GPU share (a DRA claim)"
"""How the hardening messages name what a claimed container requests."""


# ------------------------------------------------------------ entry points
def mutate_pod(
    pod: Obj,
    *,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
    claimed: Mapping[str, int] | None = None,
) -> Decision:
    """Rules 1-8 for a Pod being created.

    ``claimed`` (DRA mode, :mod:`webhook.dra`): containers that hold a GPU share
    through a claim rather than units (pods of a converted template, or asking
    for memory only), with their units. They count as metagpu containers for
    rules 2, 3 and 5, as their units would.
    """
    meta = as_map(pod.get("metadata"), "metadata")
    spec = as_map(pod.get("spec"), "spec")
    findings = Findings()
    pod_containers = containers(spec, "/spec")

    if opted_out(meta, namespace):
        # No mutation and no conversion: the pod is not ours. But a label any pod
        # author can set must not switch off the checks that keep one pod away
        # from another pod's GPU, so those still deny.
        opted_out_gpu = False
        for c in pod_containers:
            plan = plan_gpu(c, settings=settings, findings=Findings())
            if plan.units:
                opted_out_gpu = True
                edit = EnvEdit.of(c)
                check_gpu_container(
                    edit,
                    resource=plan.resource,
                    settings=settings,
                    findings=findings,
                    may_strip=False,
                )
                check_mps_env(
                    edit, policy=None, settings=settings, findings=findings, may_strip=False
                )
        if opted_out_gpu:
            check_mps_volumes(spec, settings=settings, findings=findings)
        return _decide(findings, [], namespace=namespace)

    plans = [plan_gpu(c, settings=settings, findings=findings, meta=meta) for c in pod_containers]
    if claimed:
        plans = [
            GpuPlan(p.container, units=claimed[p.container.name], resource=CLAIMED, has_gpu=True)
            if not p.has_gpu and p.container.name in claimed
            else p
            for p in plans
        ]
    check_pod_resources(spec, settings=settings, findings=findings)
    ops: list[PatchOperation] = []
    uses_metagpu = False
    for plan in plans:
        if plan.resource_ops:
            ops.extend(plan.resource_ops)
        if plan.warnings:
            findings.warnings.extend(plan.warnings)
        if plan.units:
            uses_metagpu = True

    runtime_class = spec.get("runtimeClassName")
    policy: ComputePolicy | None = None
    annotations: dict[str, str] = {}
    if uses_metagpu:
        ops.extend(_toleration_ops(spec, settings))
        if not runtime_class and settings.runtime_class_name:
            runtime_class = settings.runtime_class_name
            ops.append(add_op("/spec/runtimeClassName", runtime_class))
        ops.extend(_scheduler_ops(spec, settings, findings))
        check_mps_volumes(spec, settings=settings, findings=findings)
        pod_annotations = annotations_of(meta)
        # In DRA mode the share's CDI spec carries the compute policy (the DRA
        # plugin's ``compute_policy``) and overrides the pod's variables: rule 4
        # would only write values the runtime replaces.
        if settings.dra is None:
            policy = _resolve_policy(pod_annotations, namespace, settings, findings)
        if policy is not None and pod_annotations.get(ANNOTATION_COMPUTE_POLICY) is None:
            annotations[ANNOTATION_COMPUTE_POLICY] = policy

    void = settings.void_non_gpu_containers and runtime_class == settings.void_runtime_class
    if not uses_metagpu and not void:
        return _decide(findings, ops, namespace=namespace)  # most pods: nothing of ours
    for plan in plans:
        edit = EnvEdit.of(plan.container)
        if plan.units:
            check_gpu_container(
                edit, resource=plan.resource, settings=settings, findings=findings, may_strip=True
            )
            check_mps_env(edit, policy=policy, settings=settings, findings=findings, may_strip=True)
            if policy is not None:
                add_policy_env(
                    edit, units=plan.units, policy=policy, settings=settings, findings=findings
                )
        elif plan.has_gpu:
            continue  # whole NVIDIA GPUs: NVIDIA's plugin decides what it sees
        elif void:
            void_no_gpu_container(
                edit, settings=settings, findings=findings, pod_uses_metagpu=uses_metagpu
            )
        elif uses_metagpu:
            check_no_gpu_container(edit, settings=settings, findings=findings, may_strip=True)
        ops.extend(edit.ops())

    record = {p.container.name: p.original for p in plans if p.original}
    restated = frozenset(p.container.name for p in plans if p.restates_request)
    dropped = frozenset(p.container.name for p in plans if p.leaves_metagpu)
    return _decide(
        findings,
        ops,
        namespace=namespace,
        meta=_MetaChange("/metadata", meta, annotations, record, restated, dropped),
    )


def mutate_pod_update(
    pod: Obj,
    *,
    old_pod: Obj | None,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
) -> Decision:
    """Rule 1 for a Pod UPDATE: a re-applied manifest is the pod it already is.

    ``kubectl apply`` of a Pod manifest again merges ``nvidia.com/gpu: 0.5``
    back into a pod that holds ``cnvrg.io/metagpu: 50``; without help the API
    server refuses it (``must be an integer``). The same conversion as on CREATE
    turns it back into the stored pod. A pod's resources cannot change after
    creation, so a manifest that now asks for a different share is refused with
    what to do instead; the API server would refuse it anyway, less clearly.
    Every other UPDATE (labels, finalizers, ...) is left alone: rules 2-5 were
    applied at creation, and the fields they set cannot change.
    """
    meta = as_map(pod.get("metadata"), "metadata")
    if opted_out(meta, namespace):
        return UNCHANGED
    spec = as_map(pod.get("spec"), "spec")
    findings = Findings()
    held = _held_units(old_pod, settings)
    ops: list[PatchOperation] = []
    record: dict[str, Mapping[str, str]] = {}
    restated: set[str] = set()
    dropped: set[str] = set()
    for c in containers(spec, "/spec"):
        plan = plan_gpu(c, settings=settings, findings=findings, meta=meta)
        if not plan.resource_ops:
            continue  # nothing to convert: whatever else changed is not ours
        before = held.get(c.name)
        if before is not None and before != (plan.resource, plan.units):
            findings.deny(
                f"{c.label}: the manifest asks for {_asked(plan)}, but this pod was created "
                f"with {before[0]} {before[1]} and a running pod's GPU share cannot change; "
                "delete the pod and create it again (or change the share in its Deployment, "
                "Job or other workload, whose pods are then replaced)"
            )
            continue
        ops.extend(plan.resource_ops)
        findings.warnings.extend(plan.warnings)
        if plan.original:
            record[c.name] = plan.original
        if plan.restates_request:
            restated.add(c.name)
        if plan.leaves_metagpu:
            dropped.add(c.name)
    if not ops and not findings.problems:
        return UNCHANGED
    return _decide(
        findings,
        ops,
        namespace=namespace,
        meta=_MetaChange("/metadata", meta, {}, record, frozenset(restated), frozenset(dropped)),
    )


def _held_units(old_pod: Obj | None, settings: RuleSettings) -> dict[str, tuple[str, int]]:
    """Per container of the stored pod: (metagpu resource, units) it holds."""
    if old_pod is None:
        return {}
    held: dict[str, tuple[str, int]] = {}
    old_spec = as_map(old_pod.get("spec"), "oldObject.spec")
    for c in containers(old_spec, "/spec"):
        limits = as_map(as_map(c.obj.get("resources"), c.label).get("limits"), c.label)
        for name in settings.metagpu_resources:
            raw = limits.get(name)
            if isinstance(raw, str) and raw.isdigit():
                held[c.name] = (name, int(raw))
                break
    return held


def _asked(plan: GpuPlan) -> str:
    """``nvidia.com/gpu 700m``: what the container's manifest asks for, as sent."""
    return ", ".join(f"{k} {v}" for k, v in (plan.original or {}).items())


def mutate_ephemeral_containers(
    pod: Obj,
    *,
    old_pod: Obj | None,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
    claimed: Mapping[str, int] | None = None,
) -> Decision:
    """Rule 5 for the ``pods/ephemeralcontainers`` subresource (``kubectl debug``).

    Ephemeral containers cannot request resources, so they are never GPU
    containers; but a debug container that sets ``NVIDIA_VISIBLE_DEVICES`` in a
    GPU pod could see every GPU on the node. Only containers being added are
    checked: the API server refuses changes to existing ones anyway. ``claimed`` as for
    :func:`mutate_pod`: in DRA mode a GPU pod holds claims, not units.
    """
    meta = as_map(pod.get("metadata"), "metadata")
    spec = as_map(pod.get("spec"), "spec")
    findings = Findings()
    existing: set[str] = set()
    if old_pod is not None:
        old_spec = as_map(old_pod.get("spec"), "oldObject.spec")
        existing = {c.name for c in container_list(old_spec, "ephemeralContainers", "/spec")}
    uses_metagpu = bool(claimed) or any(
        plan_gpu(c, settings=settings, findings=Findings()).units for c in containers(spec, "/spec")
    )
    is_opted_out = opted_out(meta, namespace)
    void = (
        not is_opted_out
        and settings.void_non_gpu_containers
        and spec.get("runtimeClassName") == settings.void_runtime_class
    )
    ops: list[PatchOperation] = []
    new = container_list(spec, "ephemeralContainers", "/spec", label="ephemeral container")
    for c in new:
        if c.name in existing:
            continue
        edit = EnvEdit.of(c)
        if void:
            void_no_gpu_container(
                edit, settings=settings, findings=findings, pod_uses_metagpu=uses_metagpu
            )
        elif uses_metagpu:
            check_no_gpu_container(
                edit, settings=settings, findings=findings, may_strip=not is_opted_out
            )
        ops.extend(edit.ops())
    return _decide(findings, ops, namespace=namespace)


def mutate_workload(
    obj: Obj,
    *,
    group: str,
    kind: str,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
) -> Decision:
    """Rule 9: rule 1 applied to a workload's pod template (CREATE and UPDATE).

    The API server validates the template at the workload level, so ``500m``
    there is refused before any pod exists. Only the conversion (and its
    denials) happens here; tolerations, runtime class, policy and hardening
    come from the pod rules when the controller creates the pods. The template
    also gets the ``original-request`` record, which its pods inherit.
    """
    path = WORKLOAD_TEMPLATE_PATHS.get((group, kind))
    if path is None:
        return UNCHANGED
    template: Any = obj
    for key in path:
        template = template.get(key) if isinstance(template, Mapping) else None
    if template is None:
        return UNCHANGED  # e.g. a ReplicationController without a template
    where = ".".join(path)
    template = as_map(template, where)
    meta = as_map(template.get("metadata"), where, ".metadata")
    spec = as_map(template.get("spec"), where, ".spec")
    findings = Findings()
    if opted_out(meta, namespace):
        return _decide(findings, [], namespace=namespace)
    base = "/" + "/".join(path)
    ops: list[PatchOperation] = []
    record: dict[str, Mapping[str, str]] = {}
    restated: set[str] = set()
    dropped: set[str] = set()
    for c in containers(spec, base + "/spec"):
        plan = plan_gpu(c, settings=settings, findings=findings, meta=meta)
        ops.extend(plan.resource_ops)
        findings.warnings.extend(f"{kind} template: {w}" for w in plan.warnings)
        if plan.resource_ops and plan.original:
            record[c.name] = plan.original
            if plan.restates_request:
                restated.add(c.name)
        if plan.leaves_metagpu:
            dropped.add(c.name)
    if not ops:
        return _decide(findings, [], namespace=namespace)
    meta_change = _MetaChange(
        base + "/metadata", meta, {}, record, frozenset(restated), frozenset(dropped)
    )
    return _decide(findings, ops, namespace=namespace, meta=meta_change)


# -------------------------------------------------------------- decision
class _MetaChange(NamedTuple):
    """Annotations to add to the object's (or template's) metadata when it changes."""

    base: str
    meta: Obj
    annotations: dict[str, str]
    record: dict[str, Mapping[str, str]]
    restated: frozenset[str] = frozenset()
    """Containers whose request replaces an older record (:attr:`GpuPlan.restates_request`)."""
    dropped: frozenset[str] = frozenset()
    """Containers that no longer use metagpu (:attr:`GpuPlan.leaves_metagpu`): out of the record."""


def _decide(
    findings: Findings,
    ops: list[PatchOperation],
    *,
    namespace: NamespaceFacts,
    meta: _MetaChange | None = None,
) -> Decision:
    """Deny with every problem found, or allow with the operations (plus rule 8).

    Why the namespace could not be read is only worth a warning when the answer
    depended on it, i.e. when something was changed or refused: a pod that asks
    for no GPU should not print a metagpu warning on every ``kubectl run``.

    ``ops`` and ``meta.annotations`` are the caller's own, built for this call:
    they are extended in place rather than copied.
    """
    if findings.problems:
        messages = dict.fromkeys(m for m, _ in findings.problems)
        reason: DenialReason = (
            "Forbidden" if any(r == "Forbidden" for _, r in findings.problems) else "Invalid"
        )
        return Denial(
            message="; ".join(messages),
            reason=reason,
            warnings=tuple(dict.fromkeys([*namespace.warnings, *findings.warnings])),
        )
    if meta is not None and (ops or meta.annotations):
        annotations = meta.annotations
        recorded = _merged_record(
            annotations_of(meta.meta),
            meta.record,
            findings,
            replace=meta.restated,
            drop=meta.dropped,
        )
        if recorded == "":
            ops.append(_record_removal(meta.base, annotations_of(meta.meta)))
        elif recorded is not None:
            annotations[ANNOTATION_ORIGINAL_REQUEST] = recorded
        ops.extend(_annotation_ops(meta.base, meta.meta, annotations))
    if not ops and not findings.warnings:
        return UNCHANGED
    warnings = findings.warnings
    if ops and namespace.warnings:
        warnings = [*namespace.warnings, *warnings]
    return Mutation(patch=tuple(ops), warnings=tuple(dict.fromkeys(warnings)) if warnings else ())


# -------------------------------------------------------------- rules 2-4
def _tolerates(existing: Mapping[str, Any], wanted: TolerationKey) -> bool:
    """True when ``existing`` tolerates every taint that ``wanted`` tolerates.

    So an ``operator: Exists`` toleration without a key (MetaGPU's own example
    pod has one) covers everything, and nothing is added twice. The pod's
    toleration is read field by field, as far as needed: most differ in effect.
    """
    effect = existing.get("effect") or ""
    if effect and effect != wanted.effect:
        return False
    seconds = existing.get("tolerationSeconds")
    if seconds is not None and (type(seconds) is not int):
        # The API server decodes it as int64 before calling us; anything else is
        # hand-made input, answered with a 400 rather than a comparison error.
        raise PodShapeError(
            f"spec.tolerations: tolerationSeconds must be an integer, got {seconds!r}"
        )
    if (
        seconds is not None
        and (wanted.effect or "NoExecute") == "NoExecute"
        and (wanted.seconds is None or seconds < wanted.seconds)
    ):
        return False  # evicted sooner than the configured toleration allows
    key = existing.get("key") or ""
    operator = existing.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != wanted.key:
        return False
    if operator == "Exists":
        return True
    return wanted.operator == "Equal" and (existing.get("value") or "") == wanted.value


def _toleration_ops(spec: Obj, settings: RuleSettings) -> list[PatchOperation]:
    """Add the configured tolerations that no toleration of the pod already covers."""
    current = spec.get("tolerations")
    existing = as_list(current, "spec.tolerations")
    missing: list[dict[str, Any]] = []
    for wanted, key in zip(settings.tolerations, settings.toleration_keys, strict=True):
        for t in existing:
            # (a dict class test first: the Mapping ABC check costs 10x more)
            if (t.__class__ is dict or isinstance(t, Mapping)) and _tolerates(t, key):
                break
        else:
            missing.append(dict(wanted))
    if not missing:
        return []
    if current is None:
        return [add_op("/spec/tolerations", missing)]
    return [add_op("/spec/tolerations/-", t) for t in missing]


DEFAULT_SCHEDULER: Final = "default-scheduler"


def _scheduler_ops(
    spec: Mapping[str, Any], settings: RuleSettings, findings: Findings
) -> list[PatchOperation]:
    """Point a metagpu pod at the GPU-aware scheduler (``scheduler_name``).

    Only pods that leave the choice to Kubernetes (no ``schedulerName``, or the
    ``default-scheduler`` the API server defaults it to): a pod that names
    another scheduler chose it on purpose, so it keeps it, and the warning says
    what it gives up.
    """
    wanted = settings.scheduler_name
    if wanted is None:
        return []
    current = spec.get("schedulerName")
    if current in (None, "", DEFAULT_SCHEDULER):
        return [add_op("/spec/schedulerName", wanted)]
    if current != wanted:
        findings.warnings.append(
            f"schedulerName {current!r} kept: this pod's GPU shares are placed without "
            f"per-GPU knowledge and may be split over GPUs (metagpu pods use {wanted!r})"
        )
    return []


def _resolve_policy(
    annotations: Obj, namespace: NamespaceFacts, settings: RuleSettings, findings: Findings
) -> ComputePolicy | None:
    """The pod's own annotation, else its namespace's, else the config default.

    A bad value on the pod is the author's to fix (denied); a bad value on the
    namespace is not, so it falls back to the default with a warning.
    """
    own = annotations.get(ANNOTATION_COMPUTE_POLICY)
    if own is not None:
        if own in COMPUTE_POLICIES:
            return own  # type: ignore[no-any-return]
        findings.deny(
            f"pod annotation {ANNOTATION_COMPUTE_POLICY} must be one of "
            f"{', '.join(COMPUTE_POLICIES)}: got {own!r}"
        )
        return None
    ns_value = namespace.compute_policy
    if ns_value is not None:
        if ns_value in COMPUTE_POLICIES:
            return ns_value  # type: ignore[return-value]
        findings.warn(
            f"namespace annotation {ANNOTATION_COMPUTE_POLICY}={ns_value!r} is not one of "
            f"{', '.join(COMPUTE_POLICIES)}; using the default {settings.default_compute_policy!r}"
        )
    return settings.default_compute_policy


# ---------------------------------------------------------- rule 8 + meta
_RECORD_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
"""How the record is written: compact, sorted, ASCII (so it reads the same in any tool)."""


def _merged_record(
    annotations: Obj,
    record: dict[str, Mapping[str, str]],
    findings: Findings,
    *,
    replace: frozenset[str] = frozenset(),
    drop: frozenset[str] = frozenset(),
) -> str | None:
    """The ``original-request`` value after this run, or None when it need not change,
    or ``""`` when the annotation goes (the containers in ``drop`` left metagpu, and
    none is left to record).

    An earlier record wins for a container it already names: after a
    Deployment's template was converted, its pods arrive with units, and the
    record inherited from the template still says what the user wrote. Except
    for the containers in ``replace``, whose fraction was converted just now: a
    re-applied manifest says what the user wants now (``0.5`` changed to
    ``0.7``), so its request replaces the record, and a record that says
    something else than the units held would refuse the next re-apply.
    """
    old = annotations.get(ANNOTATION_ORIGINAL_REQUEST)
    if old is None:
        return _record_text(record)  # the usual case: a pod converted for the first time
    merged: dict[str, Any] = {}
    try:
        parsed = json.loads(old) if isinstance(old, str) else None
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        merged = parsed
    else:
        findings.warn(
            f"annotation {ANNOTATION_ORIGINAL_REQUEST} was not a JSON object; replaced it"
        )
    for name, original in record.items():
        if name in replace:
            merged[name] = original
        else:
            merged.setdefault(name, original)
    for name in drop:
        merged.pop(name, None)
    if not merged:
        return ""
    text = _RECORD_ENCODER.encode(merged)
    return None if text == old else text


def _record_text(record: dict[str, Mapping[str, str]]) -> str:
    """``_RECORD_ENCODER.encode(record)``, through orjson when that gives the same text.

    It does whenever the text is plain ASCII without DEL (which the standard
    library would escape); container names and quantities are. Strings only:
    the two write numbers differently.
    """
    try:
        text = orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # a lone surrogate (not from the HTTP path)
        return _RECORD_ENCODER.encode(record)
    if text.isascii() and b"\x7f" not in text:
        return text.decode("ascii")
    return _RECORD_ENCODER.encode(record)


def _record_removal(base: str, annotations: Obj) -> PatchOperation:
    """Remove the record; with the map when it held nothing else (the webhook made it)."""
    if len(annotations) == 1:
        return {"op": "remove", "path": f"{base}/annotations"}
    key = escape_pointer(ANNOTATION_ORIGINAL_REQUEST)
    return {"op": "remove", "path": f"{base}/annotations/{key}"}


def _annotation_ops(base: str, meta: Obj, annotations: Mapping[str, str]) -> list[PatchOperation]:
    """Add annotations, creating ``metadata``/``annotations`` when missing, null or empty.

    RFC 6902 ``add`` replaces an existing member, so adding a whole map over an
    empty (or null) one loses nothing.
    """
    if not annotations:
        return []
    if not meta:
        return [add_op(base, {"annotations": dict(annotations)})]
    if not meta.get("annotations"):
        return [add_op(base + "/annotations", dict(annotations))]
    return [add_op(f"{base}/annotations/{escape_pointer(k)}", v) for k, v in annotations.items()]
