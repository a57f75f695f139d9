"""Kubernetes API permissions of the device plugin (a ClusterRole: pods are in every namespace).

Light (plugin.api only), so the chart tests can import it without the plugin.
The plugin's tests run its pod watch against the fake API and assert that the
verbs it sent equal :func:`~plugin.api.permissions.verb_set` of this tuple.
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
        why="read the scheduler extender's GPU assignments (metagpu.io/assigned-gpus) of "
        "the pods bound to this node: list+watch with fieldSelector spec.nodeName=<this "
        "node> (RBAC cannot scope a list by field, hence cluster-wide); read-only",
    ),
)
