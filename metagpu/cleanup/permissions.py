"""Kubernetes API permissions ``metagpu cleanup`` needs, and nothing more.

Light on purpose (standard library and ``plugin.api`` only) so the chart's
RBAC tests and ``--help`` can import it without kubernetes-asyncio.

* ``nodes``: ``list`` (to find the Nodes that carry a key of ours) and
  ``patch`` (a merge patch that sets only those keys to null). Cluster-scoped,
  and RBAC cannot restrict ``list`` by name; ``patch`` cannot be restricted
  either, since the nodes are not known when the chart is rendered. No ``get``,
  ``update`` or ``delete``: a patch of named keys cannot clobber another
  controller's labels, and a Node is never removed.
* ``leases``: ``delete`` on the release's Leases only, by name (a Role in the
  release namespace). A Lease that is already gone answers 404, which is fine.
* ``resourcequotas`` ``list`` (by the quota mirror's label, every namespace) and
  ``delete``, with ``--quota-companions``: the companions limit a resource nothing
  serves once the release is gone. The users' own quotas are never touched.
* DRA mode only: ``resourceclaimtemplates`` ``list`` (by label, every namespace)
  and ``delete``, and ``pods`` ``list`` (to keep a template a pod still
  names). Across namespaces, so a ClusterRole; ``delete`` cannot be limited
  by name because the controller named the templates after the pods' shares.

The tests in ``tests/metagpu/test_cleanup.py`` assert that the verbs cleanup
sends equal :func:`plugin.api.permissions.verb_set` of :func:`permissions_for`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from plugin.api.permissions import Permission

LEASE_GROUP: Final = "coordination.k8s.io"
RESOURCE_GROUP: Final = "resource.k8s.io"


def permissions_for(
    *, leases: Iterable[str], dra: bool, quota_companions: bool = False
) -> tuple[Permission, ...]:
    """The rules for these Lease names, with the DRA rules when ``dra`` and the quota
    mirror's companions when ``quota_companions``."""
    rules = [
        Permission(
            group="",
            resource="nodes",
            verbs=frozenset({"list", "patch"}),
            namespaced=False,
            why="find the Nodes that carry the agent's metagpu.io/* labels or annotations and "
            "remove exactly those keys with a merge patch",
        ),
    ]
    names = frozenset(leases)
    if names:
        rules.append(
            Permission(
                group=LEASE_GROUP,
                resource="leases",
                verbs=frozenset({"delete"}),
                resource_names=names,
                why="delete the release's leader-election Leases, which Helm did not create",
            )
        )
    if dra:
        rules += [
            Permission(
                group=RESOURCE_GROUP,
                resource="resourceclaimtemplates",
                verbs=frozenset({"list", "delete"}),
                namespaced=False,
                why="find the ResourceClaimTemplates labelled managed-by=metagpu in every "
                "namespace and delete those no pod names",
            ),
            Permission(
                group="",
                resource="pods",
                verbs=frozenset({"list"}),
                namespaced=False,
                why="keep a template that a pod still names in spec.resourceClaims",
            ),
        ]
    if quota_companions:
        rules.append(
            Permission(
                group="",
                resource="resourcequotas",
                verbs=frozenset({"list", "delete"}),
                namespaced=False,
                why="find the quota mirror's companion ResourceQuotas (managed-by="
                "metagpu-quota-mirror) in every namespace and delete them",
            )
        )
    return tuple(rules)
