"""Kubernetes API permissions of the scheduler pod (light: stdlib + plugin.api only).

Two declarations, for the two containers that share the pod's ServiceAccount:

* :data:`PERMISSIONS`: what ``metagpu scheduler-extender`` itself calls. It
  lists and watches Nodes (their GPU ledgers), Pods (assignments not yet
  reported) and Namespaces (``metagpu.io/placement-policy``), reads a pod at
  bind when no filter call told it the pod's request, and creates
  ``pods/binding`` (with the assignment as an annotation of the Binding, so it
  never patches pods), and lists and watches PodDisruptionBudgets (which
  preemption weighs). ``tests/extender/test_cluster.py`` asserts the verbs it
  sends to the fake API are exactly these.
* :data:`PREEMPTION`: what it calls only when it preempts for a fraction
  itself: ``pods/eviction`` (the Eviction API, so budgets are honoured) and
  ``events`` on the preemptor and its victims;
  ``tests/extender/test_preemption_cluster.py`` checks them.
* :data:`LEADER_ELECTION`: kube-scheduler's lease under its own name. The
  built-in ``system:kube-scheduler`` ClusterRole only lets it get and update
  the lease named ``kube-scheduler``.

Everything else kube-scheduler needs comes from binding the built-in
``system:kube-scheduler`` and ``system:volume-scheduler`` ClusterRoles (and
``extension-apiserver-authentication-reader`` in kube-system), as the upstream
"Configure Multiple Schedulers" task does; the install tests check those too.
"""

from __future__ import annotations

from typing import Final

from plugin.api.permissions import Permission

LEASE_NAME: Final = "metagpu-scheduler"
"""kube-scheduler's leader-election lease (in the release namespace), not the default
scheduler's ``kube-scheduler``: the two schedulers must never contend for one lease."""

PERMISSIONS: Final[tuple[Permission, ...]] = (
    Permission(
        group="",
        resource="nodes",
        verbs=frozenset({"list", "watch"}),
        namespaced=False,
        why="read every node's metagpu.io/gpu-ledger annotation (watch-backed cache)",
    ),
    Permission(
        group="",
        resource="pods",
        verbs=frozenset({"get", "list", "watch"}),
        namespaced=False,
        why="find bound pods whose GPU assignment their node has not reported (watch), "
        "and read a pod's request at bind when no filter call carried it (get)",
    ),
    Permission(
        group="",
        resource="pods/binding",
        verbs=frozenset({"create"}),
        namespaced=False,
        why="bind a pod to its node with its metagpu.io/assigned-gpus annotation, atomically",
    ),
    Permission(
        group="",
        resource="namespaces",
        verbs=frozenset({"list", "watch"}),
        namespaced=False,
        why="read the metagpu.io/placement-policy annotation of namespaces",
    ),
    Permission(
        group="policy",
        resource="poddisruptionbudgets",
        verbs=frozenset({"list", "watch"}),
        namespaced=False,
        why="prefer preemption victims whose eviction violates no PodDisruptionBudget, "
        "as kube-scheduler does (watch-backed cache)",
    ),
)

PREEMPTION: Final[tuple[Permission, ...]] = (
    Permission(
        group="",
        resource="pods/eviction",
        verbs=frozenset({"create"}),
        namespaced=False,
        why="evict lower-priority pods so a fraction fits one GPU (PodDisruptionBudgets "
        "honoured by the API server)",
    ),
    Permission(
        group="",
        resource="events",
        verbs=frozenset({"create"}),
        namespaced=False,
        why="tell the preemptor and each victim who preempted whom, on which node and GPU",
    ),
)

LEADER_ELECTION: Final[tuple[Permission, ...]] = (
    Permission(
        group="coordination.k8s.io",
        resource="leases",
        verbs=frozenset({"create"}),
        why="kube-scheduler creates its leader-election lease on first start",
    ),
    Permission(
        group="coordination.k8s.io",
        resource="leases",
        verbs=frozenset({"get", "update"}),
        resource_names=frozenset({LEASE_NAME}),
        why="kube-scheduler renews its own lease, and only that one",
    ),
)
