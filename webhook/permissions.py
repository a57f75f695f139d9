"""Kubernetes API permissions ``metagpu webhook`` needs (light: stdlib + plugin.api only).

The webhook reads Namespaces, for the ``metagpu.io/compute-policy``
annotation and the ``metagpu.io/inject`` label: list and watch keep a cache,
get answers a cache miss. It writes nothing. ``tests/webhook/test_namespaces.py``
asserts that the verbs it sends to the fake API are exactly these, and the
install tests that the chart's ClusterRole grants exactly these.
"""

from __future__ import annotations

from typing import Final

from plugin.api.permissions import Permission

PERMISSIONS: Final[tuple[Permission, ...]] = (
    Permission(
        group="",
        resource="namespaces",
        verbs=frozenset({"get", "list", "watch"}),
        namespaced=False,
        why="read the metagpu.io/compute-policy annotation and metagpu.io/inject label "
        "of the namespace a pod is created in (watch-backed cache, GET on a miss)",
    ),
)
