"""One user's MPS clients per GPU on an MPS node: which GPUs a pod may use there (pure).

Why: the MPS control daemon runs one MPS server per user (UID), and a client of
another UID waits until every client of the running server has exited
(``nvidia-cuda-mps-control`` man page; docs/mps.md). On a node whose GPUs a
supervised MPS daemon serves (its ledger's ``enforces`` is not empty), a pod sent
to a GPU whose clients run as another user would hang at CUDA initialisation for
as long as they run. So the extender gives a pod on such a node only the GPUs
whose holders all run as the pod's own user, or that nobody holds, and a pod that
could only wait is refused with the reason.

The user is a container's ``securityContext.runAsUser``, else its pod's; only the
containers that ask for the resource count (the others are no MPS clients).

* **Unknown** (no ``runAsUser``: the image decides, which the scheduler cannot
  read): the pod may use only GPUs nobody holds, and no other pod may join a GPU it
  holds, since nobody can tell whether the users match. Set ``runAsUser`` to share
  GPUs.
* **Mixed** (the pod's GPU containers run as different users): refused on MPS
  nodes; its own containers could wait for each other on one GPU.

Holders whose pod the extender has no facts for (a bind it has not seen come back
yet) count as unknown: a GPU is shared only when it is certain to be safe.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Final

from plugin.extender.ledger import Holding, NodeView
from plugin.placement.pod import GpuState

MIXED: Final = -1
"""The pod's GPU containers run as different users (``runAsUser`` is never negative)."""

User = int | None
"""A UID, None when unknown (the image's), or :data:`MIXED`."""


def pod_user(pod: Mapping[str, Any], *, asking: Collection[str]) -> User:
    """The user the pod's MPS clients run as: the ``runAsUser`` shared by every container
    named in ``asking`` (those that ask for GPU units, from
    :func:`plugin.extender.pods.container_requests`), None when one of them has none,
    :data:`MIXED` when they differ. A pod without such containers: None."""
    spec = pod.get("spec") or {}
    pod_level = _run_as_user(spec.get("securityContext"))
    users: set[User] = set()
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or ():
            if not isinstance(container, Mapping) or container.get("name") not in asking:
                continue
            own = _run_as_user(container.get("securityContext"))
            users.add(own if own is not None else pod_level)
    if not users:
        return None
    if None in users:
        return None
    if len(users) > 1:
        return MIXED
    return next(iter(users))


def _run_as_user(context: object) -> int | None:
    if not isinstance(context, Mapping):
        return None
    value = context.get("runAsUser")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def foreign_gpus(
    user: User, holdings: Iterable[Holding], user_of: Callable[[str], User]
) -> set[int]:
    """Positions of the GPUs a pod running as ``user`` may not use: some holder there runs
    as another user, or as one nobody can name (unknown, mixed, or no facts), or the pod's
    own user is unknown and anyone holds units there."""
    blocked: set[int] = set()
    for holding in holdings:
        theirs = user_of(holding.pod_uid)
        if user is None or user == MIXED or theirs is None or theirs == MIXED or theirs != user:
            blocked.update(pos for pos, n in holding.units.items() if n)
    return blocked


def without(view: NodeView, blocked: Iterable[int]) -> NodeView:
    """``view`` with the ``blocked`` GPUs offering nothing (as an unhealthy GPU offers
    nothing, but still counted as healthy for the score)."""
    gone = set(blocked)
    gpus = tuple(
        GpuState(g.id, 0, g.healthy, g.numa) if pos in gone else g
        for pos, g in enumerate(view.gpus)
    )
    return NodeView(view.node, view.units_per_gpu, gpus, view.generation, UNSHARED_SHAPE)


UNSHARED_SHAPE: Final = -1
"""The shape of a view made for one pod: the placement memo places it without keeping the
answer (a real view's shape is a small non-negative integer, interned by the ledger)."""


def user_words(user: User) -> str:
    if user is None:
        return "this pod's GPU containers set no runAsUser: their user is the image's, unknown"
    if user == MIXED:
        return "this pod's GPU containers run as different users"
    return f"this pod runs as UID {user}"


def mixed_refusal() -> str:
    return (
        "this pod's GPU containers run as different users (securityContext.runAsUser): on an "
        "MPS node a GPU serves one user's MPS clients at a time, so they would wait for each "
        "other; run them as one user"
    )


def foreign_refusal(refusal: str, blocked: Iterable[int], user: User) -> str:
    """The placement's refusal once the GPUs of other users are taken away, with why."""
    listed = ", ".join(str(pos) for pos in sorted(blocked))
    return (
        f"{refusal}; GPU(s) {listed} of this MPS node serve other users' MPS clients, and MPS "
        f"serves one user per GPU at a time ({user_words(user)})"
    )


def for_pod(
    user: User,
    view: NodeView,
    *,
    enforces: frozenset[str] | None,
    holdings: Iterable[Holding],
    user_of: Callable[[str], User],
) -> tuple[NodeView, set[int]] | str:
    """``view`` as a pod running as ``user`` may use it, and the GPUs taken away; or why
    the node cannot take the pod at all. Nodes without a supervised MPS daemon (nothing
    in ``enforces``) are returned as they are."""
    if not enforces:
        return view, set()
    if user == MIXED:
        return mixed_refusal()
    blocked = foreign_gpus(user, holdings, user_of)
    if not blocked:
        return view, set()
    return without(view, blocked), blocked
