"""Why a pod does not fit a node: as numbers, and as the words a user reads (pure).

A refusal is a :data:`RefusalKey`, ``(kind, container, a, b, c, d)``: which
rule refused which container (its position in the pod), and the numbers the
words quote. place_pod returns it beside its words, and the vectorised
placement (:mod:`plugin.placement.fleet`) records one per node; both make the
words with :func:`refusal_words`, so a node gets the same sentence either way,
and the extender formats one sentence per distinct key rather than per node.
The sentences become FailedScheduling events through the scheduler extender;
where many nodes would each quote their own figures, :func:`range_words`
says the same with each figure's range over them
(:mod:`plugin.extender.reasons` decides when).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


REASON_NAMES: Final = {
    SHORT: "too_few_units",
    WHOLE: "too_few_whole_gpus",
    NO_SINGLE_GPU: "no_single_gpu",
    REUSE: "reuse_spread",
    HELD: "reused_gpu_full",
}
"""Each refusal kind as a metric label value (``metagpu_extender_unschedulable_total``)."""


def container_label(name: str, kind: ContainerKind) -> str:
    """How a refusal names a container: ``container "main"``, ``init container "setup"``."""
    word = {"init": "init container", "sidecar": "sidecar container", "app": "container"}[kind]
    return f'{word} "{name}"'


@dataclass(frozen=True, slots=True)
class Figure:
    """A number a refusal quotes: one node's (``lo == hi``), or its range over several nodes."""

    lo: int
    hi: int

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo} to {self.hi}"

    @property
    def one(self) -> bool:
        """Exactly 1 (for "1 GPU is" against "2 GPUs are", "0 to 1 GPUs are")."""
        return self.lo == self.hi == 1


def refusal_words(key: Sequence[int], containers: Sequence[NamedContainer]) -> str:
    """The sentence for ``key``; ``containers`` are the pod's, in the order placed.

    The names come from ``containers``, not from the key: an answer computed for
    one pod serves another of the same sizes under its own names.
    """
    kind, index, *figures = key
    return _sentence(kind, containers[index], [Figure(n, n) for n in figures])


def range_words(
    kind: int,
    index: int,
    low: Sequence[int],
    high: Sequence[int],
    containers: Sequence[NamedContainer],
) -> str:
    """One sentence for several refusals of one kind and one container: each figure
    quoted as its range over them, from its lowest to its highest value (``largest
    10 to 60``), what many nodes share; one value where they agree."""
    figures = [Figure(lo, hi) for lo, hi in zip(low, high, strict=True)]
    return _sentence(kind, containers[index], figures)


def _sentence(kind: int, target: NamedContainer, figures: Sequence[Figure]) -> str:
    a, b, c, d = figures
    label = container_label(target.name, target.kind)
    if kind == SHORT:
        note = ""
        if c.hi:
            count = f"up to {c.hi}" if c.lo == 0 else str(c)
            note = f"; {count} GPU{'' if c.one else 's'} unhealthy"
        return f"{label} needs {a} units, {b} free on healthy GPUs{note}"
    if kind == WHOLE:
        return (
            f"{label} needs {a} completely free GPU{'' if a.one else 's'} "
            f"and {b} {'is' if b.one else 'are'} ({c} units free in total)"
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
