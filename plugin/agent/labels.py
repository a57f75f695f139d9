"""The ``metagpu.io/*`` Node labels: what GPUs this node shares and how much is free.

Pure. :func:`desired_labels` turns a snapshot into label values and
:func:`label_patch` says what to change, so the adapter patches the Node only
when a value actually changed (a label write wakes every controller watching
nodes; doing it every 5 s on every GPU node would be noise at scale).

``metagpu.io/largest-free-units`` is the most units free on any single healthy
GPU: a container asking for a fraction (60 units) gets it from one GPU, so it
fits here only if this is at least 60, however many units the node has free in
total. It is the basis for fit-aware scheduling (a node affinity or a scheduler
plugin can read it).

``metagpu.io/enforces`` says which limits the node holds containers to at
allocation (``memory.fixed`` under a supervised MPS daemon, empty otherwise), from
the device plugin's board (:attr:`~plugin.agent.accounting.Snapshot.enforces`), so
``kubectl get nodes -L metagpu.io/enforces`` shows where ``fixed`` means a cap.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from plugin.agent.accounting import Snapshot
from plugin.api.resources import (
    ENFORCES_SEPARATOR,
    NODE_LABEL_ENFORCES,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_MEMORY_MIB,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_LARGEST_FREE_UNITS,
    NODE_LABEL_UNITS_PER_GPU,
)

OWNED_LABELS: Final = (
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_MEMORY_MIB,
    NODE_LABEL_UNITS_PER_GPU,
    NODE_LABEL_LARGEST_FREE_UNITS,
    NODE_LABEL_ENFORCES,
)
"""Labels the agent writes and removes; it never touches any other label."""

MIXED_PRODUCTS: Final = "mixed"
LABEL_VALUE_MAX: Final = 63
_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """A valid label value from free text: ``NVIDIA A100-SXM4-80GB`` → ``NVIDIA-A100-SXM4-80GB``.

    Runs of other characters become ``-`` (as NVIDIA's GPU feature discovery
    does); the result is cut to 63 characters and trimmed to start and end
    alphanumeric, as the API server requires.
    """
    value = _INVALID.sub("-", text)[:LABEL_VALUE_MAX]
    return value.strip("-_.")


def enforces_value(enforces: Sequence[str]) -> str:
    """The ``metagpu.io/enforces`` value: ``memory.fixed``, or empty for nothing."""
    return ENFORCES_SEPARATOR.join(enforces)


def desired_labels(snapshot: Snapshot) -> dict[str, str]:
    """The label values for this node now.

    Only GPUs that back a resource count. Heterogeneous nodes get product
    ``mixed`` and the *smallest* memory, the figure a pod can rely on whichever
    GPU it lands on. Without shared GPUs the product and memory labels are
    removed and the count and free units are 0.
    """
    shared = [g for g in snapshot.gpus if g.units_total > 0]
    labels = {
        NODE_LABEL_GPU_COUNT: str(len(shared)),
        NODE_LABEL_UNITS_PER_GPU: str(snapshot.units_per_gpu),
        NODE_LABEL_LARGEST_FREE_UNITS: str(
            max((g.units_free for g in shared if g.healthy), default=0)
        ),
        NODE_LABEL_ENFORCES: enforces_value(snapshot.enforces),
    }
    if shared:
        names = {g.name for g in shared}
        product = label_value(names.pop()) if len(names) == 1 else MIXED_PRODUCTS
        if product:
            labels[NODE_LABEL_GPU_PRODUCT] = product
        labels[NODE_LABEL_GPU_MEMORY_MIB] = str(min(g.memory_total_mib for g in shared))
    return labels


def label_patch(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str | None]:
    """The ``metadata.labels`` merge-patch that turns ``current`` into ``desired``.

    Only :data:`OWNED_LABELS` are considered; ``None`` removes a label. Empty
    when nothing changed, so the caller skips the write.
    """
    patch: dict[str, str | None] = {}
    for key in OWNED_LABELS:
        want = desired.get(key)
        if current.get(key) != want:
            patch[key] = want
    return patch


def full_label_patch(desired: Mapping[str, str]) -> dict[str, str | None]:
    """The merge-patch that sets every one of :data:`OWNED_LABELS` without knowing the
    Node's labels: the desired value, or ``None`` (remove) for one not wanted.

    The agent sends it when it does not know what the Node carries (at start,
    after a failed write), instead of reading the Node first: a merge patch is
    idempotent, an unchanged Node is not written (the API server skips a no-op
    patch, so no watcher wakes), and a label this agent set earlier but no
    longer wants is still removed. It saves the agent the ``get nodes``
    permission."""
    return {key: desired.get(key) for key in OWNED_LABELS}
