"""Kubernetes API permissions of ``metagpu dra-plugin`` (a ClusterRole: slices and
Nodes are cluster-scoped, claims are in every namespace).

Light (plugin.api only), so the chart tests can import it without the plugin. What
``plugin/dra/kube.py`` sends: the node's ResourceSlice read, created and replaced
(never deleted: a rolling update must not hide the GPUs from the scheduler) and
watched by field selector; a claim read by name at prepare time; its own Node read
once for the container runtime check.
"""

from __future__ import annotations

from typing import Final

from plugin.api.permissions import Permission

GROUP: Final = "resource.k8s.io"

PERMISSIONS: Final = (
    Permission(
        group=GROUP,
        resource="resourceslices",
        verbs=frozenset({"get", "list", "watch", "create", "update"}),
        namespaced=False,
        why="publish this node's ResourceSlice and publish it again when the kubelet "
        "(or anyone) deletes it (list+watch with fieldSelector spec.nodeName, spec.driver)",
    ),
    Permission(
        group=GROUP,
        resource="resourceclaims",
        verbs=frozenset({"get"}),
        namespaced=False,
        why="read a claim's allocation when the kubelet asks to prepare it (the kubelet "
        "sends only namespace, name and UID)",
    ),
    Permission(
        group="",
        resource="nodes",
        verbs=frozenset({"get"}),
        namespaced=False,
        why="read this node's containerRuntimeVersion for the CDI runtime check",
    ),
)
