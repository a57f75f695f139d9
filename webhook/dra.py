"""DRA mode (``mode: dra``): a GPU share becomes a ResourceClaim, not units.

Pure, like :mod:`webhook.rules`. The same pod spec a user writes for the device
plugin (``nvidia.com/gpu: 0.5``, ``cnvrg.io/metagpu: 50``) is served through
Dynamic Resource Allocation (``docs/dra.md``): each container with a share gets
its own pod-level claim, ``spec.resourceClaims[{name: gpu-<container>,
resourceClaimTemplateName: metagpu-50u-40gi}]`` and ``resources.claims[{name:
gpu-<container>}]``, and the extended resource leaves its limits and requests.
The ResourceClaimTemplates are one per distinct share shape, named from the
shape (:class:`Shape`), so the webhook never needs to create anything: a
controller keeps them in each namespace (:mod:`webhook.claimtemplates`).

How one review is answered, in two steps whose JSON Patches are concatenated
(RFC 6902 applies operations in order, so the second step's operations,
computed on the first step's result, apply after it):

1. The device-plugin rules (:mod:`webhook.rules`): conversion of fractions into
   units with every denial and the ``original-request`` record, tolerations,
   runtime class, hardening. Rule 4's environment is off in DRA mode: the
   share's CDI spec sets the compute policy and overrides the pod's variables.
2. :func:`_claim_ops`: units (and ``metagpu.io/gpu-memory``) become claims.

So a re-applied manifest (the fraction merged back beside the claims this
webhook wrote) comes back to exactly the stored object, and a second admission
of a converted object changes nothing: step 1 finds nothing to convert and
step 2 finds no units.

Memory: a units-only claim would be charged, and limited to, the DRA plugin's
``memory`` default (1Gi), so every claim asks for memory too: what the
container asked for with ``metagpu.io/gpu-memory``, or the device plugin's
limit for its units, ``floor(gpu_memory_mib × units / units_per_gpu)`` rounded
down to the plugin's step (the scheduler rounds requests up to the step, and
the shares of one GPU must still fit its memory).

Init containers get claims as the kubelet prepares them: every claim of a pod
is prepared before its first container starts and held until the pod ends. A
regular init container runs alone, before the others, so it shares the claim
of an app container of the same shape (as the device plugin lets an init
container's devices be reused) instead of holding a second share for the pod's
whole life; a sidecar (``restartPolicy: Always``) runs beside them and gets its
own.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from plugin.api.quantity import MIB, Quantity, QuantityError, format_mib, read_quantity
from plugin.api.resources import DRA_MEMORY, DRA_UNITS
from webhook.model import (
    UNCHANGED,
    Container,
    Decision,
    Denial,
    DenialReason,
    DraSettings,
    Findings,
    Mutation,
    NamespaceFacts,
    Obj,
    PatchOperation,
    RuleSettings,
    add_op,
    as_list,
    as_map,
    containers,
    escape_pointer,
    opted_out,
)
from webhook.patching import applied
from webhook.rules import (
    NO_NAMESPACE_FACTS,
    WORKLOAD_TEMPLATE_PATHS,
    mutate_ephemeral_containers,
    mutate_pod,
    mutate_pod_update,
    mutate_workload,
)

GIB_IN_MIB: Final = 1024

CLAIM_API_VERSION: Final = "resource.k8s.io/v1"
REQUEST_NAME: Final = "gpu"
"""The request's name in every template, as captured (the CDI spec's request name)."""
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "metagpu"
CLAIM_ENTRY_PREFIX: Final = "gpu-"
DNS_LABEL_MAX: Final = 63

Change = Literal["create", "workload", "pod-update"]
"""What is admitted: a new pod, a workload template (CREATE or UPDATE), a pod UPDATE."""


# ------------------------------------------------------------------ shapes
@dataclass(frozen=True, order=True)
class Shape:
    """What one claim asks of one GPU: units (None: memory only) and memory in MiB."""

    units: int | None
    memory_mib: int

    def template_name(self, prefix: str) -> str:
        """``metagpu-50u-40gi``, ``metagpu-10gi``: deterministic, so every replica of
        the webhook and the controller agree on it without talking to each other."""
        memory = format_mib(self.memory_mib).lower()
        if self.units is None:
            return f"{prefix}-{memory}"
        return f"{prefix}-{self.units}u-{memory}"

    def capacity_requests(self) -> dict[str, str]:
        """``capacity.requests`` of the claim: the DRA plugin's capacity names."""
        requests = {DRA_MEMORY: format_mib(self.memory_mib)}
        if self.units is not None:
            requests[DRA_UNITS] = str(self.units)
        return dict(sorted(requests.items()))


_TEMPLATE_NAME: Final = re.compile(
    r"(?:(?P<units>[1-9][0-9]*)u-)?(?P<n>[1-9][0-9]*)(?P<unit>gi|mi)"
)


def parse_template_name(name: str, prefix: str) -> Shape | None:
    """The shape a template name of ours stands for, or None when it is not one of ours."""
    if not name.startswith(prefix + "-"):
        return None
    match = _TEMPLATE_NAME.fullmatch(name[len(prefix) + 1 :])
    if match is None:
        return None
    n = int(match["n"])
    memory_mib = n * GIB_IN_MIB if match["unit"] == "gi" else n
    if match["unit"] == "mi" and memory_mib % GIB_IN_MIB == 0:
        return None  # we would have written Gi: not a name we make
    units = int(match["units"]) if match["units"] else None
    return Shape(units, memory_mib)


def memory_for_units(units: int, *, units_per_gpu: int, dra: DraSettings) -> int:
    """The memory a units-only share asks for, in MiB: the device plugin's limit for
    ``units`` of the smallest GPU, rounded down to the plugin's step, at least its min."""
    exact = dra.gpu_memory_mib * units // units_per_gpu
    stepped = exact // dra.memory_step_mib * dra.memory_step_mib
    return min(max(stepped, dra.memory_min_mib), dra.gpu_memory_mib)


def claim_template(shape: Shape, *, namespace: str, dra: DraSettings) -> dict[str, Any]:
    """The ResourceClaimTemplate for ``shape`` in ``namespace``, as the API server stores it
    (``resourceclaimtemplate-50-units-40gi-accepted.json``), labelled as ours so the
    controller deletes only templates it made."""
    return {
        "apiVersion": CLAIM_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": shape.template_name(dra.template_prefix),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
        "spec": {
            "metadata": {},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": REQUEST_NAME,
                            "exactly": {
                                "deviceClassName": dra.device_class_name,
                                "allocationMode": "ExactCount",
                                "count": 1,
                                "capacity": {"requests": shape.capacity_requests()},
                            },
                        }
                    ]
                }
            },
        },
    }


def claim_entry_name(container: str) -> str:
    """The pod-level claim a container's share is held in: ``gpu-<container>``.

    A container name is a DNS label of up to 63 characters, and so must the entry
    be: longer ones keep their start and get a hash of the whole name, so two
    containers never share an entry by accident.
    """
    name = CLAIM_ENTRY_PREFIX + container
    if len(name) <= DNS_LABEL_MAX:
        return name
    digest = hashlib.sha256(container.encode()).hexdigest()[:8]
    head = name[: DNS_LABEL_MAX - 9].rstrip("-")
    return f"{head}-{digest}"


def shapes_in(obj: Obj, *, prefix: str) -> set[Shape]:
    """The shapes of the templates a pod spec's claims name (for the controller)."""
    found: set[Shape] = set()
    for entry in as_list(as_map(obj).get("resourceClaims"), "spec.resourceClaims"):
        if isinstance(entry, Mapping):
            template = entry.get("resourceClaimTemplateName")
            if isinstance(template, str):
                shape = parse_template_name(template, prefix)
                if shape is not None:
                    found.add(shape)
    return found


# ------------------------------------------------------------ entry points
def mutate_pod_dra(
    pod: Obj, *, settings: RuleSettings, namespace: NamespaceFacts = NO_NAMESPACE_FACTS
) -> Decision:
    """A Pod CREATE in DRA mode: the pod rules, then units and memory become claims."""
    dra = _dra(settings)
    spec = as_map(pod.get("spec"), "spec")
    claimed = _claimed(spec, dra=dra)
    first = mutate_pod(pod, settings=settings, namespace=namespace, claimed=claimed)
    meta = as_map(pod.get("metadata"), "metadata")
    if isinstance(first, Denial) or opted_out(meta, namespace):
        return first
    after = _applied(pod, first)
    return _then_claims(
        first, as_map(after.get("spec")), "/spec", settings=settings, dra=dra, change="create"
    )


def mutate_ephemeral_containers_dra(
    pod: Obj,
    *,
    old_pod: Obj | None,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
) -> Decision:
    """``kubectl debug`` in DRA mode: a pod holding our claims is a GPU pod, so a debug
    container that would see every GPU is refused as in device-plugin mode."""
    dra = _dra(settings)
    claimed = _claimed(as_map(pod.get("spec"), "spec"), dra=dra)
    return mutate_ephemeral_containers(
        pod, old_pod=old_pod, settings=settings, namespace=namespace, claimed=claimed
    )


def mutate_pod_update_dra(
    pod: Obj,
    *,
    old_pod: Obj | None,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
) -> Decision:
    """A Pod UPDATE in DRA mode: a re-applied manifest comes back to the stored pod.

    Containers of a pod created in device-plugin mode (holding units) are left as
    they are: a running pod's claims cannot be added.
    """
    dra = _dra(settings)
    first = mutate_pod_update(pod, old_pod=old_pod, settings=settings, namespace=namespace)
    meta = as_map(pod.get("metadata"), "metadata")
    if isinstance(first, Denial) or opted_out(meta, namespace):
        return first
    keep: frozenset[str] = frozenset()
    if old_pod is not None:
        old_spec = as_map(old_pod.get("spec"), "oldObject.spec")
        keep = frozenset(
            c.name
            for c in containers(old_spec, "/spec")
            if any(
                n in as_map(as_map(c.obj.get("resources")).get("limits"))
                for n in settings.metagpu_resources
            )
        )
    after = _applied(pod, first)
    return _then_claims(
        first,
        as_map(after.get("spec")),
        "/spec",
        settings=settings,
        dra=dra,
        change="pod-update",
        keep=keep,
    )


def mutate_workload_dra(
    obj: Obj,
    *,
    group: str,
    kind: str,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
) -> Decision:
    """Rule 9 in DRA mode: the template's shares become claims, so its pods arrive
    with them (and the API server never sees ``500m`` at the workload level)."""
    dra = _dra(settings)
    path = WORKLOAD_TEMPLATE_PATHS.get((group, kind))
    if path is None:
        return UNCHANGED
    first = mutate_workload(obj, group=group, kind=kind, settings=settings, namespace=namespace)
    if isinstance(first, Denial):
        return first
    after = _applied(obj, first)
    template: Any = after
    for key in path:
        template = template.get(key) if isinstance(template, Mapping) else None
    if template is None:
        return first
    template = as_map(template, ".".join(path))
    if opted_out(as_map(template.get("metadata")), namespace):
        return first
    base = "/" + "/".join(path)
    return _then_claims(
        first,
        as_map(template.get("spec")),
        base + "/spec",
        settings=settings,
        dra=dra,
        change="workload",
        label=f"{kind} template: ",
    )


# --------------------------------------------------------------- internals
def _dra(settings: RuleSettings) -> DraSettings:
    if settings.dra is None:
        raise ValueError("DRA rules called without mode: dra")
    return settings.dra


def _applied(obj: Obj, decision: Decision) -> Obj:
    """``obj`` after the first step's patch (the object itself when there is none)."""
    if not isinstance(decision, Mutation) or not decision.patch:
        return obj
    return applied(obj, decision.patch)


def _claimed(spec: Obj, *, dra: DraSettings) -> dict[str, int]:
    """Containers holding a share without units: a claim of ours, or memory asked for.

    Pods of a converted template arrive like this; they are metagpu pods for the
    rules that add tolerations and runtime class and harden GPU containers.
    """
    ours: dict[str, int] = {}
    for entry in as_list(spec.get("resourceClaims"), "spec.resourceClaims"):
        if isinstance(entry, Mapping):
            template = entry.get("resourceClaimTemplateName")
            shape = (
                parse_template_name(template, dra.template_prefix)
                if isinstance(template, str)
                else None
            )
            name = entry.get("name")
            if shape is not None and isinstance(name, str):
                ours[name] = shape.units or 1
    claimed: dict[str, int] = {}
    for c in containers(spec, "/spec"):
        resources = as_map(c.obj.get("resources"), c.label, " resources")
        for side in ("limits", "requests"):
            if dra.memory_resource_name in as_map(resources.get(side), c.label, " ", side):
                claimed[c.name] = 1
        for ref in as_list(resources.get("claims"), c.label, " resources.claims"):
            if isinstance(ref, Mapping) and ref.get("name") in ours:
                claimed[c.name] = ours[ref["name"]]
    return claimed


@dataclass(frozen=True)
class _Share:
    """One container's share after the first step: its shape and what to remove."""

    container: Container
    shape: Shape
    remove: tuple[str, ...]
    """The resource names to take out of its limits and requests."""
    sidecar: bool
    init: bool


def _then_claims(
    first: Decision,
    spec: Obj,
    base: str,
    *,
    settings: RuleSettings,
    dra: DraSettings,
    change: Change,
    keep: frozenset[str] = frozenset(),
    label: str = "",
) -> Decision:
    """The first step's decision followed by the claim operations (or their denial)."""
    assert isinstance(first, Mutation)
    findings = Findings()
    ops = _claim_ops(
        spec, base, settings=settings, dra=dra, change=change, keep=keep, findings=findings
    )
    # Step 1's "converted to cnvrg.io/metagpu 50" is not what happens in DRA mode.
    converted = f" converted to {settings.resource_name} "
    warnings = [w for w in first.warnings if converted not in w]
    if findings.problems:
        messages = dict.fromkeys(m for m, _ in findings.problems)
        forbidden = any(r == "Forbidden" for _, r in findings.problems)
        reason: DenialReason = "Forbidden" if forbidden else "Invalid"
        return Denial(message="; ".join(messages), reason=reason, warnings=tuple(warnings))
    warnings.extend(label + w for w in findings.warnings)
    if not ops and len(warnings) == len(first.warnings):
        return first
    return Mutation(patch=(*first.patch, *ops), warnings=tuple(dict.fromkeys(warnings)))


def _claim_ops(
    spec: Obj,
    base: str,
    *,
    settings: RuleSettings,
    dra: DraSettings,
    change: Change,
    keep: frozenset[str],
    findings: Findings,
) -> list[PatchOperation]:
    """Units and memory of every container become a claim (step 2)."""
    _check_pod_memory(spec, dra=dra, findings=findings)
    shares: list[_Share] = []
    for c in containers(spec, base):
        if c.name in keep:
            continue
        share = _share_of(c, settings=settings, dra=dra, findings=findings)
        if share is not None:
            shares.append(share)
    if not shares or findings.problems:
        return []

    # Which pod-level claim each share is held in.
    app_entries: dict[Shape, str] = {}
    for s in shares:
        if not s.init:
            app_entries.setdefault(s.shape, claim_entry_name(s.container.name))
    entries: dict[str, str] = {}  # container -> entry name
    for s in shares:
        shared = app_entries.get(s.shape) if s.init and not s.sidecar else None
        entries[s.container.name] = shared or claim_entry_name(s.container.name)

    existing: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for i, entry in enumerate(as_list(spec.get("resourceClaims"), "spec.resourceClaims")):
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            existing.setdefault(entry["name"], (i, entry))
    ours = {
        name
        for name, (_, held) in existing.items()
        if isinstance(held.get("resourceClaimTemplateName"), str)
        and parse_template_name(held["resourceClaimTemplateName"], dra.template_prefix)
    }
    ops: list[PatchOperation] = []
    new_entries: list[dict[str, str]] = []
    added: set[str] = set()
    for s in shares:
        c = s.container
        entry = entries[c.name]
        template = s.shape.template_name(dra.template_prefix)
        ops.extend(_remove_resources(c, s.remove))
        ops.extend(_reference_ops(c, entry, ours=ours))
        found = existing.get(entry)
        if entry in added:
            continue
        added.add(entry)
        if found is None:
            new_entries.append({"name": entry, "resourceClaimTemplateName": template})
            findings.warn(
                f"{c.label}: {_describe(s.shape)} served through DRA: claim {entry} from "
                f"ResourceClaimTemplate {template}"
            )
            continue
        index, held = found
        current = held.get("resourceClaimTemplateName")
        if current == template:
            continue
        if not isinstance(current, str) or not parse_template_name(current, dra.template_prefix):
            findings.deny(
                f"{c.label}: spec.resourceClaims already has an entry {entry!r} that metagpu "
                f"did not write ({_shown_entry(held)}); metagpu holds this container's GPU "
                f"share in a claim of that name: rename your claim"
            )
        elif change == "pod-update":
            findings.deny(
                f"{c.label}: the manifest asks for {_describe(s.shape)}, but this pod was "
                f"created with ResourceClaimTemplate {current} and a running pod's GPU share "
                "cannot change; delete the pod and create it again (or change the share in "
                "its Deployment, Job or other workload, whose pods are then replaced)"
            )
        else:
            ops.append(
                {
                    "op": "replace",
                    "path": f"{base}/resourceClaims/{index}/resourceClaimTemplateName",
                    "value": template,
                }
            )
            findings.warn(
                f"{c.label}: GPU share changed: ResourceClaimTemplate {current} → {template}"
            )
    if new_entries:
        if spec.get("resourceClaims") is None:
            ops.append(add_op(f"{base}/resourceClaims", new_entries))
        else:
            ops.extend(add_op(f"{base}/resourceClaims/-", e) for e in new_entries)
    if change == "workload":
        ops.extend(_unused_entry_ops(spec, base, entries=entries, ours=ours, findings=findings))
    return [] if findings.problems else ops


def _unused_entry_ops(
    spec: Obj, base: str, *, entries: Mapping[str, str], ours: set[str], findings: Findings
) -> list[PatchOperation]:
    """Remove our claim entries no container uses any more (a workload's share moved to
    another entry: an init container whose app twin changed its share, a container renamed
    in a re-applied manifest), or each would hold a GPU share for nothing.

    Workloads only: a pod's claims cannot change after creation. Removed last and from the
    highest index down, so the replace operations before them keep their indices.
    """
    used: set[str] = set()
    for c in containers(spec, base):
        if c.name in entries:
            used.add(entries[c.name])
            continue
        refs = as_list(as_map(c.obj.get("resources")).get("claims"), c.label, " resources.claims")
        used.update(r["name"] for r in refs if isinstance(r, Mapping) and "name" in r)
    ops: list[PatchOperation] = []
    listed = as_list(spec.get("resourceClaims"), "spec.resourceClaims")
    for index in reversed(range(len(listed))):
        held = listed[index]
        name = held.get("name") if isinstance(held, Mapping) else None
        if name in ours and name not in used:
            ops.append({"op": "remove", "path": f"{base}/resourceClaims/{index}"})
            findings.warn(f"claim {name} removed: no container uses it any more")
    return ops


def _describe(shape: Shape) -> str:
    memory = format_mib(shape.memory_mib)
    if shape.units is None:
        return f"a GPU share of {memory} of GPU memory"
    return f"a GPU share of {shape.units} units and {memory} of GPU memory"


def _shown_entry(entry: Mapping[str, Any]) -> str:
    for key in ("resourceClaimTemplateName", "resourceClaimName"):
        if isinstance(entry.get(key), str):
            return f"{key}: {entry[key]}"
    return "no template"


def _share_of(
    c: Container, *, settings: RuleSettings, dra: DraSettings, findings: Findings
) -> _Share | None:
    """The share a container asks for after step 1, or None when it asks for none."""
    resources = as_map(c.obj.get("resources"), c.label, " resources")
    if not resources:
        return None
    limits = as_map(resources.get("limits"), c.label, " resources.limits")
    requests = as_map(resources.get("requests"), c.label, " resources.requests")
    units: int | None = None
    remove: list[str] = []
    for name in sorted(settings.metagpu_resources):
        if name not in limits and name not in requests:
            continue
        if name != settings.resource_name:
            findings.deny(
                f"{c.label}: {name} is a per-model pool, which DRA mode does not have yet; "
                f"ask for nvidia.com/gpu or {settings.resource_name} (any GPU the DRA plugin "
                "serves)"
            )
            return None
        read = _read_pair(c, name, limits, requests, findings)
        if read is None:
            return None
        units = read[0].numerator  # (step 1 checked it: whole, 1..max_units, limit = request)
        remove.append(name)
    memory_mib: int | None = None
    memory_name = dra.memory_resource_name
    if memory_name in limits or memory_name in requests:
        memory_mib = _memory_mib(c, limits, requests, dra=dra, findings=findings)
        if memory_mib is None:
            return None
        remove.append(memory_name)
        whole = [n for n in settings.gpu_resources if n in limits and n not in remove]
        if whole:
            findings.deny(
                f"{c.label} asks for {memory_name} beside whole GPUs ({', '.join(whole)}); "
                f"GPU memory sizes a share: ask for a share (e.g. nvidia.com/gpu: 0.5) or "
                f"for memory alone"
            )
            return None
    if units is None and memory_mib is None:
        return None
    if units is not None and units > settings.units_per_gpu:
        findings.deny(
            f"{c.label} asks for {units} units ({_gpus(units, settings.units_per_gpu)} GPUs); "
            f"in DRA mode a share is part of one GPU: ask for at most 1 GPU "
            f"({settings.resource_name}: {settings.units_per_gpu}), or for whole GPUs with "
            "nvidia.com/gpu (served by NVIDIA's device plugin)"
        )
        return None
    if memory_mib is None:
        assert units is not None
        memory_mib = memory_for_units(units, units_per_gpu=settings.units_per_gpu, dra=dra)
    restart = c.obj.get("restartPolicy")
    init = "/initContainers/" in c.path
    return _Share(
        c,
        Shape(units, memory_mib),
        tuple(remove),
        sidecar=init and restart == "Always",
        init=init,
    )


def _gpus(units: int, units_per_gpu: int) -> str:
    whole, rest = divmod(units, units_per_gpu)
    if not rest:
        return str(whole)
    return f"{units / units_per_gpu:g}"


def _read_pair(
    c: Container, name: str, limits: Obj, requests: Obj, findings: Findings
) -> tuple[Quantity, Any] | None:
    """``name``'s value and the text it came from; limits and requests must agree."""
    read: dict[str, tuple[Quantity, Any]] = {}
    for side, values in (("limits", limits), ("requests", requests)):
        if name not in values:
            continue
        try:
            read[side] = (read_quantity(values[name]), values[name])
        except QuantityError as exc:
            findings.deny(f"{c.label}: {side} {name}: {exc}")
            return None
    if (
        "limits" in read
        and "requests" in read
        and read["limits"][0].value != read["requests"][0].value
    ):
        findings.deny(
            f"{c.label}: {name} limits ({_shown(read['limits'][1])}) and requests "
            f"({_shown(read['requests'][1])}) disagree; set both to the same value, or set "
            "only limits"
        )
        return None
    return read.get("limits") or read.get("requests")


def _shown(raw: Any) -> str:
    return f'"{raw}"' if isinstance(raw, str) else repr(raw)


def _memory_mib(
    c: Container, limits: Obj, requests: Obj, *, dra: DraSettings, findings: Findings
) -> int | None:
    """``metagpu.io/gpu-memory`` in MiB, or None (and a denial) when it is no such amount."""
    name = dra.memory_resource_name
    read = _read_pair(c, name, limits, requests, findings)
    if read is None:
        return None
    value, raw = read
    accepted = (
        f"ask for a whole number of MiB up to the GPU's "
        f"{format_mib(dra.gpu_memory_mib)}, such as 10Gi or 1536Mi"
    )
    shown = _shown(raw)
    if value.numerator <= 0:
        findings.deny(f"{c.label}: {name} {shown} asks for no memory; {accepted}")
        return None
    if not value.whole or value.numerator % MIB:
        findings.deny(f"{c.label}: {name} {shown} is not a whole number of MiB; {accepted}")
        return None
    mib = value.numerator // MIB
    if mib > dra.gpu_memory_mib:
        findings.deny(
            f"{c.label}: {name} {shown} is more than a GPU has "
            f"({format_mib(dra.gpu_memory_mib)}, dra.gpu_memory_mib); {accepted}"
        )
        return None
    return mib


def _check_pod_memory(spec: Obj, *, dra: DraSettings, findings: Findings) -> None:
    """Pod-level ``spec.resources`` takes no GPU memory either."""
    resources = as_map(spec.get("resources"), "spec.resources")
    for side in ("limits", "requests"):
        if dra.memory_resource_name in as_map(resources.get(side), "spec.resources.", side):
            findings.deny(
                f"pod-level spec.resources.{side} cannot hold {dra.memory_resource_name}; "
                "ask for GPU memory in each container's resources instead"
            )


def _remove_resources(c: Container, names: tuple[str, ...]) -> list[PatchOperation]:
    """Take ``names`` out of limits and requests; a map left empty goes (as the API
    server would drop it), so the result equals a fresh conversion's."""
    resources = as_map(c.obj.get("resources"), c.label, " resources")
    ops: list[PatchOperation] = []
    for side in ("limits", "requests"):
        current = as_map(resources.get(side), c.label, " resources.", side)
        present = [n for n in names if n in current]
        if not present:
            continue
        if len(present) == len(current):
            ops.append({"op": "remove", "path": f"{c.path}/resources/{side}"})
            continue
        ops.extend(
            {"op": "remove", "path": f"{c.path}/resources/{side}/{escape_pointer(n)}"}
            for n in present
        )
    return ops


def _reference_ops(c: Container, entry: str, *, ours: set[str]) -> list[PatchOperation]:
    """``resources.claims`` of the container names ``entry`` (once), and no other claim of
    ours: its share is in ``entry`` alone (an init container that shared its app twin's
    claim gets its own when the twin's share changes). The user's own claims stay."""
    resources = as_map(c.obj.get("resources"), c.label, " resources")
    refs = resources.get("claims")
    listed = as_list(refs, c.label, " resources.claims")
    if refs is None:
        return [add_op(f"{c.path}/resources/claims", [{"name": entry}])]
    names = [r.get("name") if isinstance(r, Mapping) else None for r in listed]
    ops: list[PatchOperation] = [
        {"op": "remove", "path": f"{c.path}/resources/claims/{i}"}
        for i in reversed(range(len(names)))
        if names[i] in ours and names[i] != entry
    ]
    if entry not in names:
        ops.append(add_op(f"{c.path}/resources/claims/-", {"name": entry}))
    return ops


__all__ = [
    "CLAIM_API_VERSION",
    "Shape",
    "claim_entry_name",
    "claim_template",
    "memory_for_units",
    "mutate_ephemeral_containers_dra",
    "mutate_pod_dra",
    "mutate_pod_update_dra",
    "mutate_workload_dra",
    "parse_template_name",
    "shapes_in",
]
