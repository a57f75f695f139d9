"""What ``metagpu cleanup`` removes, decided from the objects it read (pure).

The keys come from the agent's own constants
(:data:`plugin.agent.labels.OWNED_LABELS`, :data:`plugin.agent.ledger.OWNED_ANNOTATIONS`),
so a label the agent starts writing is cleaned up without anyone remembering
this module. Everything a person would otherwise run by hand is spelt out
here too (:func:`node_command` and friends), so a failure's log line says
exactly what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from plugin.agent.labels import OWNED_LABELS
from plugin.agent.ledger import OWNED_ANNOTATIONS

Obj = dict[str, Any]

NODE_LABELS: Final[tuple[str, ...]] = tuple(OWNED_LABELS)
NODE_ANNOTATIONS: Final[tuple[str, ...]] = tuple(OWNED_ANNOTATIONS)
MANAGED_BY_SELECTOR: Final = "app.kubernetes.io/managed-by=metagpu"
"""The mark of the DRA claim-template controller (:data:`webhook.dra.MANAGED_BY`);
a test checks they agree, so this module stays free of the webhook."""


COMPANION_SELECTOR: Final = "app.kubernetes.io/managed-by=metagpu-quota-mirror"
"""The mark of the quota mirror's companion ResourceQuotas
(:data:`webhook.quotas.mirror.MANAGED_BY`); a test checks they agree."""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def node_patch(node: Mapping[str, Any]) -> Obj | None:
    """The merge patch that removes the agent's keys this Node carries; None: none.

    Only keys present are named, so a Node without them is not written (no
    watcher wakes) and the patch never mentions a key of anyone else's.
    """
    meta = _map(node.get("metadata"))
    labels = _map(meta.get("labels"))
    annotations = _map(meta.get("annotations"))
    patch: Obj = {}
    drop_labels = {k: None for k in NODE_LABELS if k in labels}
    drop_annotations = {k: None for k in NODE_ANNOTATIONS if k in annotations}
    if drop_labels:
        patch["labels"] = drop_labels
    if drop_annotations:
        patch["annotations"] = drop_annotations
    return {"metadata": patch} if patch else None


def template_users(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Template name -> the pods (of one namespace) whose ``spec.resourceClaims`` name it."""
    users: dict[str, list[str]] = {}
    for pod in pods:
        name = str(_map(pod.get("metadata")).get("name", "?"))
        claims = _map(pod.get("spec")).get("resourceClaims")
        for claim in claims if isinstance(claims, list) else []:
            template = _map(claim).get("resourceClaimTemplateName")
            if isinstance(template, str):
                users.setdefault(template, []).append(name)
    return users


# ------------------------------------------------------ what to do by hand
def node_command(node: str | None = None) -> str:
    """The kubectl commands that remove the agent's keys from ``node`` (None: every node)."""
    target = node or "--all"
    labels = " ".join(f"{k}-" for k in NODE_LABELS)
    annotations = " ".join(f"{k}-" for k in NODE_ANNOTATIONS)
    return f"kubectl label node {target} {labels} && kubectl annotate node {target} {annotations}"


def lease_command(namespace: str, name: str) -> str:
    return f"kubectl -n {namespace} delete lease {name}"


def template_command(namespace: str | None = None, name: str | None = None) -> str:
    if namespace is None or name is None:
        return f"kubectl delete resourceclaimtemplates -A -l {MANAGED_BY_SELECTOR}"
    return f"kubectl -n {namespace} delete resourceclaimtemplate {name}"


def companion_command(namespace: str | None = None, name: str | None = None) -> str:
    if namespace is None or name is None:
        return f"kubectl delete resourcequotas -A -l {COMPANION_SELECTOR}"
    return f"kubectl -n {namespace} delete resourcequota {name}"


# ------------------------------------------------------------------ report
@dataclass
class Report:
    """What one run did, kept and could not do; printed at the end."""

    done: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Left on purpose, with why (a template a pod still names)."""
    failed: list[str] = field(default_factory=list)
    """Each with the command that does it by hand."""

    def summary(self) -> str:
        lines = [
            f"metagpu cleanup: {len(self.done)} done, {len(self.kept)} kept, "
            f"{len(self.failed)} failed"
        ]
        lines += [f"  done: {line}" for line in self.done]
        lines += [f"  kept: {line}" for line in self.kept]
        lines += [f"  FAILED: {line}" for line in self.failed]
        return "\n".join(lines)
