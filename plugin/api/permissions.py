"""Kubernetes API permissions a component needs, declared next to the code that uses them.

Each component that talks to the API server exports a ``PERMISSIONS`` tuple
(``webhook.permissions``, ``certs.permissions``, ``plugin.agent.permissions``).
Two tests keep it honest from both sides:

* the component's own tests run it against ``tests.harness.kube_api`` and
  assert the recorded ``(group, resource, verb)`` set equals what it declares;
* the install tests assert the chart's RBAC grants exactly the declared set.

So "least privilege" is checked, not promised.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Permission:
    """One RBAC rule: verbs on a resource of an API group (``""`` is core)."""

    group: str
    resource: str
    """Plural, with ``/subresource`` where one is used (``nodes/status``)."""
    verbs: frozenset[str]
    resource_names: frozenset[str] = field(default_factory=frozenset)
    """Empty: any object. RBAC cannot restrict ``create``/``list``/``watch`` by name."""
    namespaced: bool = True
    """False for cluster-scoped resources, or a namespaced one read across namespaces
    (a ClusterRole rather than a Role)."""
    why: str = ""
    """What the component does with it; rendered as a comment in the chart."""


def verb_set(permissions: Iterable[Permission]) -> set[tuple[str, str, str]]:
    """Flatten to ``(group, resource, verb)`` triples, the shape the fake API records."""
    return {(p.group, p.resource, v) for p in permissions for v in p.verbs}
