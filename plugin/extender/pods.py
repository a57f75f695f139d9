"""What a pod asks of the extender: its containers' metagpu units and its placement policy (pure).

The scheduler sends the whole Pod object; the extender needs only each
container's ``cnvrg.io/metagpu`` request, in the kubelet's order (init
containers, then app containers), with native sidecars told apart from
regular init containers (``restartPolicy: Always``), because
:func:`plugin.placement.pod.place_pod` replays the kubelet on exactly that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from plugin.api.config import AllocationPolicy
from plugin.api.scheduling import ANNOTATION_PLACEMENT_POLICY, PLACEMENT_POLICIES
from plugin.placement.pod import ContainerRequest
from plugin.placement.refusals import ContainerKind


class PodSpecError(ValueError):
    """The pod cannot be read as a metagpu request; ``str()`` says what and why."""


def container_requests(pod: Mapping[str, Any], *, resource: str) -> tuple[ContainerRequest, ...]:
    """Each container's units of ``resource`` in the kubelet's allocation order.

    The request counts; a limit alone sets the request (extended resources
    are never overcommitted, KUBELET-FACTS section 4). Containers that ask for
    none are kept (with 0 units) so the order stays the pod's.
    """
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise PodSpecError("the pod has no spec")
    found: list[ContainerRequest] = []
    for field, default_kind in (("initContainers", "init"), ("containers", "app")):
        items = spec.get(field) or []
        if not isinstance(items, list):
            raise PodSpecError(f"spec.{field} must be a list, got {type(items).__name__}")
        for pos, container in enumerate(items):
            if not isinstance(container, Mapping):
                raise PodSpecError(f"spec.{field}[{pos}] must be an object")
            name = container.get("name")
            if not isinstance(name, str) or not name:
                raise PodSpecError(f"spec.{field}[{pos}] has no name")
            kind: ContainerKind = default_kind  # type: ignore[assignment]
            if default_kind == "init" and container.get("restartPolicy") == "Always":
                kind = "sidecar"
            found.append(ContainerRequest(name, kind, _units(container, resource, name)))
    return tuple(found)


def _units(container: Mapping[str, Any], resource: str, name: str) -> int:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise PodSpecError(f'container "{name}": resources must be an object')
    for section in ("requests", "limits"):
        values = resources.get(section) or {}
        if isinstance(values, Mapping) and resource in values:
            raw = values[resource]
            try:
                units = int(str(raw))
            except ValueError:
                raise PodSpecError(
                    f'container "{name}": {resource} {section} {raw!r} is not a whole '
                    "number of units (extended resources are integers)"
                ) from None
            if units < 0:
                raise PodSpecError(f'container "{name}": {resource} {section} {raw!r} is negative')
            return units
    return 0


def placement_policy(
    pod: Mapping[str, Any],
    *,
    namespace_annotations: Mapping[str, str] | None,
    default: AllocationPolicy,
) -> tuple[AllocationPolicy, str | None]:
    """The pod's placement policy and, when an annotation was invalid, a warning.

    The pod's ``metagpu.io/placement-policy`` annotation wins over its
    namespace's, which wins over the extender's default: the order
    ``metagpu.io/compute-policy`` follows in the webhook.
    """
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    for where, source in (("pod", annotations), ("namespace", namespace_annotations or {})):
        value = source.get(ANNOTATION_PLACEMENT_POLICY) if isinstance(source, Mapping) else None
        if value is None:
            continue
        if value in PLACEMENT_POLICIES:
            return cast(AllocationPolicy, value), None
        return default, (
            f"{where} annotation {ANNOTATION_PLACEMENT_POLICY}={value!r} is not one of "
            f"{', '.join(PLACEMENT_POLICIES)}; using {default}"
        )
    return default, None
