"""The words the webhook's rules speak: decisions, settings, findings, and pod access.

Pure and shared by :mod:`webhook.rules` (the entry points),
:mod:`webhook.conversion` (rule 1) and :mod:`webhook.environment` (rules 4
and 5). Pods are plain dicts as the API server sends them; the accessors here
read them defensively, raising :class:`PodShapeError` where a map or a list
is something else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from typing import Any, Final, Literal, NamedTuple, NotRequired, TypedDict

from plugin.api.resources import LABEL_INJECT, NVIDIA_GPU_RESOURCE
from webhook.config import ComputePolicy, DraConfig, VisibleDevicesPolicy, WebhookConfig

Obj = Mapping[str, Any]
PatchOp = Literal["add", "remove", "replace"]


class PatchOperation(TypedDict):
    """One RFC 6902 operation, as the API server applies it."""

    op: PatchOp
    path: str
    value: NotRequired[Any]


DenialReason = Literal["Invalid", "Forbidden"]
"""``Invalid`` (HTTP 400): a value we cannot read or convert. ``Forbidden``
(HTTP 403): a readable request that the operator's policy refuses."""

DENIAL_CODES: Final[dict[DenialReason, int]] = {"Invalid": 400, "Forbidden": 403}


class PodShapeError(ValueError):
    """The object is not shaped like a pod (a list where a map belongs, ...).

    The API server decodes every object into its type before calling a webhook,
    so this only happens with hand-made input; the server answers it with a 400
    and ``metagpu mutate`` prints it.
    """


@dataclass(frozen=True)
class NamespaceFacts:
    """What the rules need to know about the pod's namespace (raw, unvalidated)."""

    compute_policy: str | None = None
    """The Namespace's ``metagpu.io/compute-policy`` annotation, if any."""
    inject: str | None = None
    """The Namespace's ``metagpu.io/inject`` label, if any."""
    warnings: tuple[str, ...] = ()
    """Why the facts may be incomplete (lookup failed): passed on to the response."""
    unit_warnings: tuple[str, ...] = ()
    """Said only when the admitted object asks for metagpu units (the namespace's GPU
    quotas do not count them); :func:`webhook.admission.admit` adds them."""


NO_NAMESPACE_FACTS: Final = NamespaceFacts()


@dataclass(frozen=True)
class Mutation:
    """Allow, with these operations (possibly none) and warnings for kubectl."""

    patch: tuple[PatchOperation, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Denial:
    """Refuse, with a message naming the container, the value and what is accepted."""

    message: str
    reason: DenialReason = "Invalid"
    warnings: tuple[str, ...] = ()

    @property
    def code(self) -> int:
        return DENIAL_CODES[self.reason]


Decision = Mutation | Denial

UNCHANGED: Final = Mutation()


class TolerationKey(NamedTuple):
    """A configured toleration with Kubernetes' defaults filled in, built once at start-up,
    so comparing a pod's tolerations with it reads only the pod's fields."""

    key: str
    operator: str
    value: str
    effect: str
    seconds: int | None
    """``tolerationSeconds``; None when unset."""

    @classmethod
    def of(cls, toleration: Mapping[str, Any]) -> TolerationKey:
        get = toleration.get
        return cls(
            get("key") or "",
            get("operator") or "Equal",
            get("value") or "",
            get("effect") or "",
            get("tolerationSeconds"),
        )


@dataclass(frozen=True)
class DraSettings:
    """DRA mode's part of the config (``mode: dra``), for :mod:`webhook.dra`."""

    device_class_name: str
    gpu_memory_mib: int
    memory_step_mib: int
    memory_min_mib: int
    memory_resource_name: str
    template_prefix: str

    @classmethod
    def of(cls, config: DraConfig) -> DraSettings:
        assert config.gpu_memory_mib is not None  # WebhookConfig checks it in mode dra
        return cls(
            device_class_name=config.device_class_name,
            gpu_memory_mib=config.gpu_memory_mib,
            memory_step_mib=config.memory_step_mib,
            memory_min_mib=config.memory_min_mib,
            memory_resource_name=config.memory_resource_name,
            template_prefix=config.template_prefix,
        )


@dataclass(frozen=True)
class DraLeftovers:
    """What device-plugin mode needs to turn DRA mode's claims back into units
    (:mod:`webhook.leftovers`): the ``dra`` config section outlives ``mode: dra``,
    because Deployments and other workloads keep the claims it wrote."""

    template_prefix: str
    """``dra.template_prefix``: only claims from templates named with it are ours."""
    memory_resource_name: str
    """``dra.memory_resource_name``: how a container asks for GPU memory."""
    gpu_memory_mib: int | None
    """``dra.gpu_memory_mib``; None: memory-only shares cannot be sized in units."""

    @classmethod
    def of(cls, config: DraConfig) -> DraLeftovers:
        return cls(
            template_prefix=config.template_prefix,
            memory_resource_name=config.memory_resource_name,
            gpu_memory_mib=config.gpu_memory_mib,
        )


@dataclass(frozen=True)
class RuleSettings:
    """The config, pre-digested once for the hot path (sets, Decimals, ready-made dicts)."""

    resource_name: str
    metagpu_resources: frozenset[str]
    fraction_resources: frozenset[str]
    gpu_resources: frozenset[str]
    """Every resource name a container can ask for a GPU with (ours or NVIDIA's)."""
    units_per_gpu: int
    convert_whole_gpus: bool
    max_gpus: Decimal
    max_gpus_ratio: tuple[int, int]
    """``max_gpus`` as an exact ratio, for comparing shares without the decimal module."""
    max_units: int
    tolerations: tuple[dict[str, Any], ...]
    toleration_keys: tuple[TolerationKey, ...]
    """``tolerations`` with their defaults filled in, for comparing with a pod's."""
    runtime_class_name: str | None
    void_runtime_class: str
    """The runtime class under which containers without a GPU are voided:
    ``runtime_class_name``, or ``nvidia`` when metagpu sets none."""
    scheduler_name: str | None
    default_compute_policy: ComputePolicy
    visible_devices_policy: VisibleDevicesPolicy
    deny_privileged: bool
    void_non_gpu_containers: bool
    mps_host_directories: tuple[str, ...] = ()
    """Host directories of the MPS daemon's pipes; GPU pods may not mount them."""
    dra: DraSettings | None = None
    """``mode: dra``: shares become ResourceClaims (:mod:`webhook.dra`); None: units."""
    dra_leftovers: DraLeftovers | None = None
    """Device-plugin mode: how to convert the claims DRA mode left in workloads back into
    units (:mod:`webhook.leftovers`); None in DRA mode."""

    @classmethod
    def from_config(cls, config: WebhookConfig) -> RuleSettings:
        metagpu = frozenset([config.resource_name, *config.extra_resource_names])
        fractions = frozenset(config.fraction_resource_names)
        max_gpus = config.max_gpus
        tolerations = tuple(t.as_kubernetes() for t in config.tolerations)
        return cls(
            resource_name=config.resource_name,
            metagpu_resources=metagpu,
            fraction_resources=fractions,
            gpu_resources=metagpu | fractions | {NVIDIA_GPU_RESOURCE},
            units_per_gpu=config.units_per_gpu,
            convert_whole_gpus=config.convert_whole_gpus,
            max_gpus=max_gpus,
            max_gpus_ratio=max_gpus.as_integer_ratio(),
            max_units=config.max_units,
            tolerations=tolerations,
            toleration_keys=tuple(TolerationKey.of(t) for t in tolerations),
            runtime_class_name=config.runtime_class_name,
            void_runtime_class=config.runtime_class_name or "nvidia",
            # DRA mode: kube-scheduler's own DRA plugin keeps every share on one GPU
            # (consumable capacity), which is what the second scheduler is for; sending
            # claim pods to it would only add a hop whose feature gates (1.34-1.35) and
            # version the cluster's scheduler already has right.
            scheduler_name=None if config.mode == "dra" else config.scheduler_name,
            default_compute_policy=config.default_compute_policy,
            visible_devices_policy=config.visible_devices_policy,
            deny_privileged=config.deny_privileged,
            void_non_gpu_containers=config.void_non_gpu_containers,
            mps_host_directories=tuple(config.mps_host_directories),
            dra=DraSettings.of(config.dra) if config.mode == "dra" else None,
            dra_leftovers=DraLeftovers.of(config.dra) if config.mode != "dra" else None,
        )


@dataclass(slots=True)
class Findings:
    """Problems (reasons to deny) and warnings gathered while the rules run.

    Every problem is collected rather than stopping at the first, so one
    denial tells the user everything to fix.
    """

    problems: list[tuple[str, DenialReason]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def deny(self, message: str, reason: DenialReason = "Invalid") -> None:
        self.problems.append((message, reason))

    def warn(self, message: str) -> None:
        self.warnings.append(message)


# ------------------------------------------------------------- pod access
class Container(NamedTuple):
    """A container with where it lives, for patches and for messages.

    A NamedTuple, not a frozen dataclass: a few are built per review and a
    frozen dataclass costs several times more to construct.
    """

    obj: Obj
    path: str
    """JSON Pointer of the container (``/spec/containers/0``)."""
    name: str
    label: str
    """``container "train"``, ``init container "warmup"``: how messages name it."""


def as_map(value: Any, *where: str) -> Obj:
    """``value`` as a map; missing or null is empty.

    ``where`` names the field for the error, in pieces joined only when there
    is an error: this runs several times per container on the hot path.
    """
    if value.__class__ is dict:  # JSON objects; an ABC isinstance check costs 10x more
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodShapeError(f"{''.join(where)} must be a map, got {type(value).__name__}")
    return value


def as_list(value: Any, *where: str) -> Sequence[Any]:
    """``value`` as a list; missing or null is empty (``where`` as for :func:`as_map`)."""
    if value.__class__ is list:
        return value
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PodShapeError(f"{''.join(where)} must be a list, got {type(value).__name__}")
    return value


@lru_cache(maxsize=1024)
def escape_pointer(key: str) -> str:
    """A JSON Pointer token (RFC 6901): ``cnvrg.io/metagpu`` → ``cnvrg.io~1metagpu``."""
    return key.replace("~", "~0").replace("/", "~1")


def add_op(path: str, value: Any) -> PatchOperation:
    return {"op": "add", "path": path, "value": value}


def container_list(spec: Obj, key: str, base: str, *, label: str = "container") -> list[Container]:
    """The containers of ``spec[key]``, with their JSON Pointers under ``base``."""
    found: list[Container] = []
    for i, c in enumerate(as_list(spec.get(key), "spec.", key)):
        if c.__class__ is not dict and not isinstance(c, Mapping):
            raise PodShapeError(f"spec.{key}[{i}] must be a map, got {type(c).__name__}")
        name = c.get("name")
        shown = name if isinstance(name, str) and name else f"#{i}"
        found.append(Container(c, f"{base}/{key}/{i}", shown, f'{label} "{shown}"'))
    return found


def containers(spec: Obj, base: str) -> list[Container]:
    """Init containers, then containers (ephemeral ones cannot ask for resources)."""
    if spec.get("initContainers") is None:  # most pods
        return container_list(spec, "containers", base)
    return [
        *container_list(spec, "initContainers", base, label="init container"),
        *container_list(spec, "containers", base),
    ]


def annotations_of(meta: Obj) -> Obj:
    return as_map(meta.get("annotations"), "metadata.annotations")


def opted_out(meta: Obj, namespace: NamespaceFacts) -> bool:
    """``metagpu.io/inject: "false"`` on the object or its namespace (only that exact string)."""
    labels = as_map(meta.get("labels"), "metadata.labels")
    return labels.get(LABEL_INJECT) == "false" or namespace.inject == "false"
