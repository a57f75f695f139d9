"""Kubernetes API permissions of the node agent (a ClusterRole: it reads across namespaces).

Light (plugin.api only), so the chart tests can import it without the agent.
The agent's tests run it against the fake API and assert that the verbs it
sent equal :func:`~plugin.api.permissions.verb_set` of this tuple.
"""

from __future__ import annotations

from typing import Final

from plugin.api.permissions import Permission

PERMISSIONS: Final = (
    Permission(
        group="",
        resource="pods",
        verbs=frozenset({"list", "watch"}),
        namespaced=False,
        why="map container IDs to pods: list+watch pods with fieldSelector "
        "spec.nodeName=<this node> (RBAC cannot scope a list by field, hence cluster-wide)",
    ),
    Permission(
        group="",
        resource="nodes",
        verbs=frozenset({"patch"}),
        namespaced=False,
        why="keep the metagpu.io/* labels of its own Node current with merge patches, "
        "never reading the Node (RBAC cannot name 'the node I run on', so any node; "
        "docs/install.md shows a ValidatingAdmissionPolicy that narrows it)",
    ),
    Permission(
        group="events.k8s.io",
        resource="events",
        verbs=frozenset({"create"}),
        namespaced=False,
        why="record memory-enforcement Events on pods in any namespace, and GPU-ownership "
        "Events on its Node (namespace default); events.k8s.io/v1 for its "
        "action/reportingController/reportingInstance fields",
    ),
)
