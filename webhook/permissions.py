"""Kubernetes API permissions ``metagpu webhook`` needs (light: stdlib + plugin.api only).

* The namespace cache reads Namespaces, for the ``metagpu.io/compute-policy``
  annotation and the ``metagpu.io/inject`` label: list and watch keep a cache,
  get answers a cache miss.
* The quota cache lists and watches ResourceQuotas in every namespace, for
  the admission warning when a GPU quota does not count metagpu units.
* The quota mirror (when on) creates, repairs and deletes companion
  ResourceQuotas in any namespace, and takes and renews one Lease in its own
  namespace (``create`` cannot be limited to a name in RBAC; ``get`` and
  ``update`` are).

* In DRA mode, the claim-template controller lists and watches Pods and
  creates and deletes ResourceClaimTemplates in any namespace, under its own
  Lease (:func:`claim_template_permissions`, in :func:`permissions_for` when
  given its Lease: the chart grants them with ``webhook.mode: dra``), and, with
  ``dra.explain_waiting``, the same leader lists ResourceSlices and
  ResourceClaims and creates Events (:data:`WAITING_POD_PERMISSIONS`).

``tests/webhook/test_namespaces.py`` and ``tests/webhook/quotas/`` assert that
the verbs each part sends to the fake API are exactly these, and the install
tests that the chart grants exactly :func:`permissions_for` its values.
"""

from __future__ import annotations

from typing import Final

from plugin.api.permissions import Permission

NAMESPACE_PERMISSIONS: Final[tuple[Permission, ...]] = (
    Permission(
        group="",
        resource="namespaces",
        verbs=frozenset({"get", "list", "watch"}),
        namespaced=False,
        why="read the metagpu.io/compute-policy annotation and metagpu.io/inject label "
        "of the namespace a pod is created in (watch-backed cache, GET on a miss)",
    ),
)

QUOTA_CACHE_PERMISSIONS: Final[tuple[Permission, ...]] = (
    Permission(
        group="",
        resource="resourcequotas",
        verbs=frozenset({"list", "watch"}),
        namespaced=False,
        why="warn at admission when a namespace's GPU quota does not count metagpu units "
        "(watch-backed cache; the quota mirror reads the same way)",
    ),
)

PERMISSIONS: Final = NAMESPACE_PERMISSIONS + QUOTA_CACHE_PERMISSIONS
"""The webhook with the quota mirror off."""

LEASE_GROUP: Final = "coordination.k8s.io"


def quota_mirror_permissions(lease_name: str) -> tuple[Permission, ...]:
    """What the quota mirror adds: companion writes anywhere, and its one Lease."""
    return (
        Permission(
            group="",
            resource="resourcequotas",
            verbs=frozenset({"create", "update", "delete"}),
            namespaced=False,
            why="keep a companion ResourceQuota in metagpu units beside every GPU quota",
        ),
        Permission(
            group=LEASE_GROUP,
            resource="leases",
            verbs=frozenset({"create"}),
            why="create the quota mirror's leader-election Lease the first time",
        ),
        Permission(
            group=LEASE_GROUP,
            resource="leases",
            verbs=frozenset({"get", "update"}),
            resource_names=frozenset({lease_name}),
            why="take and renew the quota mirror's leader-election Lease",
        ),
    )


def permissions_for(
    *,
    quota_mirror: bool,
    lease_name: str,
    claim_template_lease: str | None = None,
    explain_waiting: bool = False,
) -> tuple[Permission, ...]:
    """Everything the webhook process needs with the mirror on or off, and, in DRA mode
    (``claim_template_lease`` names the controller's Lease), the claim-template controller
    and, with ``explain_waiting``, its Events on waiting pods."""
    dra = claim_template_permissions(claim_template_lease) if claim_template_lease else ()
    return (
        PERMISSIONS
        + (quota_mirror_permissions(lease_name) if quota_mirror else ())
        + dra
        + (WAITING_POD_PERMISSIONS if dra and explain_waiting else ())
    )


WAITING_POD_PERMISSIONS: Final[tuple[Permission, ...]] = (
    Permission(
        group="resource.k8s.io",
        resource="resourceslices",
        verbs=frozenset({"list"}),
        namespaced=False,
        why="see what each GPU offers, to say why a DRA pod waits (webhook/dra_waiting.py)",
    ),
    Permission(
        group="resource.k8s.io",
        resource="resourceclaims",
        verbs=frozenset({"list"}),
        namespaced=False,
        why="see what the allocated claims consume and what the waiting ones ask for",
    ),
    Permission(
        group="events.k8s.io",
        resource="events",
        verbs=frozenset({"create"}),
        namespaced=False,
        why="write the Event on a waiting pod saying what each GPU has free",
    ),
)
"""The waiting-pod Events (``dra.explain_waiting``); the Pods come from the
claim-template controller's watch (:func:`claim_template_permissions`)."""


def claim_template_permissions(lease_name: str) -> tuple[Permission, ...]:
    """What DRA mode's claim-template controller needs (webhook/claimtemplate_controller.py)."""
    return (
        Permission(
            group="",
            resource="pods",
            verbs=frozenset({"list", "watch"}),
            namespaced=False,
            why="see which ResourceClaimTemplates the pods of each namespace name",
        ),
        Permission(
            group="resource.k8s.io",
            resource="resourceclaimtemplates",
            verbs=frozenset({"list", "watch", "create", "delete"}),
            namespaced=False,
            why="keep one ResourceClaimTemplate per GPU share shape the pods name",
        ),
        Permission(
            group=LEASE_GROUP,
            resource="leases",
            verbs=frozenset({"create"}),
            why="create the claim-template controller's leader-election Lease the first time",
        ),
        Permission(
            group=LEASE_GROUP,
            resource="leases",
            verbs=frozenset({"get", "update"}),
            resource_names=frozenset({lease_name}),
            why="take and renew the claim-template controller's leader-election Lease",
        ),
    )
