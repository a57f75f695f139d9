"""Which rule answers which AdmissionReview request: the pure heart of ``/mutate``.

kopf's ``serve_admission_request`` in one function: a checked request and the
namespace facts in, a :class:`~webhook.rules.Decision` out. The HTTP adapter
only decodes, looks up the namespace (the one piece of I/O), calls
:func:`admit` and encodes. ``metagpu mutate`` calls the same rules directly.

What is ours (everything else is allowed unchanged, so a webhook registered
too broadly never blocks anything):

* ``pods`` CREATE: rules 1-8;
* ``pods`` UPDATE: rule 1 for a re-applied manifest (``kubectl apply`` of a Pod
  again), which must come back to the pod as stored;
* ``pods/ephemeralcontainers`` UPDATE (``kubectl debug``): rule 5;
* workloads (Deployment, StatefulSet, DaemonSet, ReplicaSet,
  ReplicationController, Job, CronJob) CREATE and UPDATE: rule 9.

In device-plugin mode, a Pod CREATE and a workload first get the claims an
earlier ``mode: dra`` wrote turned back into units (:mod:`webhook.leftovers`).

Any other Pod UPDATE (labels, finalizers, ...) and DELETE are never mutated:
the resources of a running pod cannot change, and ``dryRun`` requests get
exactly what a real request would (the rules have no side effects to skip).
"""

from __future__ import annotations

from typing import Final, Literal

from webhook.dra import (
    mutate_ephemeral_containers_dra,
    mutate_pod_dra,
    mutate_pod_update_dra,
    mutate_workload_dra,
)
from webhook.leftovers import mutate_pod_leftovers, mutate_workload_leftovers
from webhook.model import Obj
from webhook.quotas.coverage import with_unit_warnings
from webhook.review import AdmissionRequest
from webhook.rules import (
    NO_NAMESPACE_FACTS,
    UNCHANGED,
    WORKLOAD_TEMPLATE_PATHS,
    Decision,
    NamespaceFacts,
    RuleSettings,
    mutate_ephemeral_containers,
    mutate_pod_update,
)

Target = Literal["pod", "pod-update", "ephemeral-containers", "workload", "other"]

WORKLOAD_VERSIONS: Final[dict[str, str]] = {"apps": "v1", "batch": "v1", "": "v1"}
"""The API versions whose workload schema the template paths were written for."""


def classify(request: AdmissionRequest) -> Target:
    """What kind of request this is, for the rules and for the metrics.

    The HTTP adapter classifies once and passes the answer on (``target=``):
    it needs it for the metrics and the namespace lookup as well.
    """
    kind = request["kind"]
    group, version, name = kind["group"], kind["version"], kind["kind"]
    operation = request["operation"]
    sub = request.get("subResource")
    if name == "Pod" and group == "" and version == "v1":
        if operation == "CREATE" and not sub:
            return "pod"
        if operation == "UPDATE" and sub == "ephemeralcontainers":
            return "ephemeral-containers"
        if operation == "UPDATE" and not sub:
            return "pod-update"
        return "other"
    if (
        (group, name) in WORKLOAD_TEMPLATE_PATHS
        and WORKLOAD_VERSIONS.get(group) == version
        and operation in ("CREATE", "UPDATE")
        and not sub
    ):
        return "workload"
    return "other"


def namespace_to_look_up(request: AdmissionRequest, *, target: Target | None = None) -> str | None:
    """The namespace whose facts :func:`admit` needs, or None when it needs none.

    ``target`` is ``classify(request)`` when the caller already has it.
    """
    if (target or classify(request)) in ("other", "pod-update"):
        # A pod UPDATE only ever brings a re-applied pod back to what is stored,
        # which no namespace fact changes; most of them (labels, finalizers) are
        # not even ours. The namespaceSelector keeps opted-out namespaces away.
        return None
    return request.get("namespace") or None


def admit(
    request: AdmissionRequest,
    *,
    settings: RuleSettings,
    namespace: NamespaceFacts = NO_NAMESPACE_FACTS,
    target: Target | None = None,
) -> Decision:
    """Apply the rules that own this request. Raises ``PodShapeError`` for an object
    that is not shaped like its kind (never sent by a real API server).

    ``target`` is ``classify(request)`` when the caller already has it. The
    namespace's ``unit_warnings`` (its GPU quotas do not count units) are added
    only when the admitted object asks for metagpu units.
    """
    decision = _admit(request, settings=settings, namespace=namespace, target=target)
    if namespace.unit_warnings:
        return with_unit_warnings(
            decision, request.get("object"), settings=settings, warnings=namespace.unit_warnings
        )
    return decision


def _admit(
    request: AdmissionRequest,
    *,
    settings: RuleSettings,
    namespace: NamespaceFacts,
    target: Target | None,
) -> Decision:
    target = target or classify(request)
    obj = request.get("object")
    if target == "other" or obj is None:
        return UNCHANGED
    if settings.dra is not None:
        return _admit_dra(request, obj, settings=settings, namespace=namespace, target=target)
    if target == "pod":
        return mutate_pod_leftovers(obj, settings=settings, namespace=namespace)
    if target == "pod-update":
        return mutate_pod_update(
            obj, old_pod=request.get("oldObject"), settings=settings, namespace=namespace
        )
    if target == "ephemeral-containers":
        return mutate_ephemeral_containers(
            obj, old_pod=request.get("oldObject"), settings=settings, namespace=namespace
        )
    kind = request["kind"]
    return mutate_workload_leftovers(
        obj, group=kind["group"], kind=kind["kind"], settings=settings, namespace=namespace
    )


def _admit_dra(
    request: AdmissionRequest,
    obj: Obj,
    *,
    settings: RuleSettings,
    namespace: NamespaceFacts,
    target: Target,
) -> Decision:
    """``mode: dra``: the same targets, answered with claims (:mod:`webhook.dra`)."""
    if target == "pod":
        return mutate_pod_dra(obj, settings=settings, namespace=namespace)
    if target == "pod-update":
        return mutate_pod_update_dra(
            obj, old_pod=request.get("oldObject"), settings=settings, namespace=namespace
        )
    if target == "ephemeral-containers":
        return mutate_ephemeral_containers_dra(
            obj, old_pod=request.get("oldObject"), settings=settings, namespace=namespace
        )
    kind = request["kind"]
    return mutate_workload_dra(
        obj, group=kind["group"], kind=kind["kind"], settings=settings, namespace=namespace
    )
