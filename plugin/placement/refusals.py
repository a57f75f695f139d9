"""Why a pod does not fit a node: as numbers, and as the words a user reads (pure).

A refusal is a :data:`RefusalKey`, ``(kind, container, a, b, c, d)``: which
rule refused which container (its position in the pod), and the numbers the
words quote. place_pod returns it beside its words, and the vectorised
placement (:mod:`plugin.placement.fleet`) records one per node; both make the
words with :func:`refusal_words`, so a node gets the same sentence either way,
and the extender formats one sentence per distinct key rather than per node.
The sentences become FailedScheduling events through the scheduler extender.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, Protocol

ContainerKind = Literal["init", "sidecar", "app"]


class NamedContainer(Protocol):
    """What a refusal needs of a container (``plugin.placement.pod.ContainerRequest``)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> ContainerKind: ...


RefusalKey = tuple[int, int, int, int, int, int]
"""``(kind, container position, a, b, c, d)``; what ``a``-``d`` hold depends on the kind."""

FITS: Final = 0
SHORT: Final = 1
"""Fewer free units on the node's healthy GPUs than the container still needs:
``(need, free in total, unhealthy GPUs)``."""
WHOLE: Final = 2
"""Fewer completely free GPUs than the container's whole-GPU part:
``(whole GPUs, completely free GPUs, free in total)``."""
NO_SINGLE_GPU: Final = 3
"""No one GPU can hold the container's fraction: ``(units, largest free, free in total)``."""
REUSE: Final = 4
"""The container would take part of reused units spread over several GPUs:
``(units, reusable units, GPUs they are on)``."""
HELD: Final = 5
"""The GPU the container's reused units are on has no room for the rest:
``(reused units, units still needed, largest free, free in total)``."""


def container_label(name: str, kind: ContainerKind) -> str:
    """How a refusal names a container: ``container "main"``, ``init container "setup"``."""
    word = {"init": "init container", "sidecar": "sidecar container", "app": "container"}[kind]
    return f'{word} "{name}"'


def refusal_words(key: Sequence[int], containers: Sequence[NamedContainer]) -> str:
    """The sentence for ``key``; ``containers`` are the pod's, in the order placed.

    The names come from ``containers``, not from the key: an answer computed for
    one pod serves another of the same sizes under its own names.
    """
    kind, index, a, b, c, d = key
    target = containers[index]
    label = container_label(target.name, target.kind)
    if kind == SHORT:
        note = f"; {c} GPU{'s' if c != 1 else ''} unhealthy" if c else ""
        return f"{label} needs {a} units, {b} free on healthy GPUs{note}"
    if kind == WHOLE:
        return (
            f"{label} needs {a} completely free GPU{'s' if a != 1 else ''} "
            f"and {b} {'is' if b == 1 else 'are'} ({c} units free in total)"
        )
    if kind == REUSE:
        return (
            f"{label} would reuse {a} of the {b} units its pod's init containers hold on "
            f"{c} GPUs, and the kubelet picks reused units in no fixed order; give the init "
            "containers a share of one GPU, or the container at least as many units"
        )
    if kind == HELD:
        return (
            f"{label}: the GPU holding its {a} reused units has no room for "
            f"{b} more (largest free {c}; {d} free in total)"
        )
    if kind == NO_SINGLE_GPU:
        return f"no single GPU has {a} free units (largest {b}; {c} free in total)"
    raise ValueError(f"not a refusal kind: {kind}")
