"""PodDisruptionBudgets as preemption weighs them (pure).

kube-scheduler prefers victims whose eviction violates no budget, and counts
the violations of a set it has to take anyway
(``pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go``,
``filterPodsWithPDBViolation``). The same rules here:

* a budget covers the pods of its namespace that its selector matches; a nil or
  empty selector matches nothing (the eviction registry says so too: "should
  match nothing, not everything"); a pod without labels matches no budget;
* a pod already in the budget's ``status.disruptedPods`` has been counted by the
  API server: evicting it again violates nothing;
* each further pod a budget covers takes one of its ``status.disruptionsAllowed``;
  past zero, that pod is a violation.

Budgets come from a watch (:mod:`plugin.extender.cache`): a few per namespace,
far fewer than pods, so the whole set is kept (bounded by
:data:`MAX_BUDGETS`) and a decision never waits on an API call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_BUDGETS = 10_000
"""Budgets kept; past this, new ones are not tracked (logged by the cache) rather than
memory growing without bound. A cluster with more budgets than this is far outside
what preemption's ordering needs."""

Requirement = tuple[str, str, frozenset[str]]
"""(key, operator, values) of a ``matchExpressions`` entry; matchLabels become ``In``."""


@dataclass(frozen=True, slots=True)
class Budget:
    """One PodDisruptionBudget, the fields preemption reads."""

    namespace: str
    name: str
    requirements: tuple[Requirement, ...]
    """Empty: the selector is nil or empty, and the budget covers no pod."""
    disruptions_allowed: int
    disrupted_pods: frozenset[str]
    """Pod names the API server has already let go (``status.disruptedPods``)."""

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if namespace != self.namespace or not self.requirements or not labels:
            return False
        return all(_holds(req, labels) for req in self.requirements)


def _holds(req: Requirement, labels: Mapping[str, str]) -> bool:
    key, op, values = req
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    return False  # an operator the API server would have rejected: match nothing


class BudgetError(ValueError):
    """The object is not a readable PodDisruptionBudget; ``str()`` says why."""


def parse_budget(obj: Mapping[str, Any]) -> Budget:
    """A Budget from a policy/v1 PodDisruptionBudget as the API serves it."""
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise BudgetError("a PodDisruptionBudget without metadata.name and metadata.namespace")
    selector = (obj.get("spec") or {}).get("selector")
    requirements: list[Requirement] = []
    if isinstance(selector, Mapping):
        for key, value in (selector.get("matchLabels") or {}).items():
            requirements.append((str(key), "In", frozenset({str(value)})))
        for expr in selector.get("matchExpressions") or []:
            if not isinstance(expr, Mapping):
                raise BudgetError(f"{namespace}/{name}: a matchExpressions entry is not an object")
            requirements.append(
                (
                    str(expr.get("key")),
                    str(expr.get("operator")),
                    frozenset(str(v) for v in expr.get("values") or ()),
                )
            )
    status = obj.get("status") or {}
    try:
        allowed = int(status.get("disruptionsAllowed") or 0)
    except (TypeError, ValueError):
        raise BudgetError(
            f"{namespace}/{name}: status.disruptionsAllowed is not a number"
        ) from None
    disrupted = status.get("disruptedPods") or {}
    return Budget(
        namespace,
        name,
        tuple(requirements),
        allowed,
        frozenset(str(k) for k in disrupted) if isinstance(disrupted, Mapping) else frozenset(),
    )


@dataclass(frozen=True, slots=True)
class Disruptable:
    """A pod as the budgets see it."""

    namespace: str
    name: str
    labels: Mapping[str, str]


def violations(pods: Sequence[Disruptable], budgets: Iterable[Budget]) -> list[bool]:
    """For each pod (in order), whether evicting it together with the ones before it
    violates a budget: ``filterPodsWithPDBViolation``'s count, budget by budget."""
    relevant = [b for b in budgets if any(b.covers(p.namespace, p.labels) for p in pods)]
    allowed = [b.disruptions_allowed for b in relevant]
    out: list[bool] = []
    for pod in pods:
        violated = False
        for i, budget in enumerate(relevant):
            if not budget.covers(pod.namespace, pod.labels):
                continue
            if pod.name in budget.disrupted_pods:
                continue
            allowed[i] -= 1
            if allowed[i] < 0:
                violated = True
        out.append(violated)
    return out


class BudgetBook:
    """Every budget the watch has seen, by namespace (bounded by :data:`MAX_BUDGETS`)."""

    def __init__(self, *, limit: int = MAX_BUDGETS) -> None:
        self._by_ns: dict[str, dict[str, Budget]] = {}
        self._count = 0
        self._limit = limit
        self.dropped = 0
        """Budgets not kept because the book was full."""

    def put(self, budget: Budget) -> None:
        names = self._by_ns.setdefault(budget.namespace, {})
        if budget.name not in names:
            if self._count >= self._limit:
                self.dropped += 1
                return
            self._count += 1
        names[budget.name] = budget

    def remove(self, namespace: str, name: str) -> None:
        names = self._by_ns.get(namespace)
        if names is not None and names.pop(name, None) is not None:
            self._count -= 1
            if not names:
                del self._by_ns[namespace]

    def replace_all(self, budgets: Iterable[Budget]) -> None:
        self._by_ns, self._count = {}, 0
        for budget in budgets:
            self.put(budget)

    def in_namespaces(self, namespaces: Iterable[str]) -> list[Budget]:
        return [b for ns in set(namespaces) for b in self._by_ns.get(ns, {}).values()]

    def __len__(self) -> int:
        return self._count
