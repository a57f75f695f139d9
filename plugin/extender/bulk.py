"""Filter and prioritize on every node at once.

A pod is decided by :func:`plugin.placement.fleet.place_pod_on_fleet` over the
:class:`~plugin.extender.matrix.NodeMatrix`, in numpy passes, instead of one
:func:`~plugin.placement.pod.place_pod` per node: issue 14's filter +
prioritize budget (5 ms for 1,000 nodes × 8 GPUs) is less than a per-node
Python loop costs on a busy machine. The answers are the ones
:func:`plugin.extender.decision.filter_nodes` and
:func:`~plugin.extender.decision.prioritize` give node by node
(property-tested), refusals word for word. Only a cluster the arrays are not
built for (more NUMA nodes than :data:`~plugin.extender.matrix.MAX_NUMA_COLUMNS`)
goes node by node.

An answer over all rows is kept per (container sizes and kinds, policy) and
recomputed only on the rows that changed since (usually the last bind's
node), so prioritize after filter for the same pod, and the pods of one
workload, cost little more than the gather by name. Names play no part in an
answer (only in the refusal's words, put in per pod).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from itertools import compress

import numpy as np

from plugin.api.config import AllocationPolicy
from plugin.extender.decision import FilterOutcome, PodAsk, fleet_scores
from plugin.extender.matrix import NodeMatrix
from plugin.extender.reasons import node_reasons
from plugin.placement.fleet import (
    NODE_BY_NODE_BELOW,
    Fleet,
    FleetPlacement,
    Ints,
    distinct_rows,
    place_pod_on_fleet,
)
from plugin.placement.refusals import ContainerKind

ANSWERS_KEPT = 32
"""Answers kept (pod sizes and policies), each one row per node: bounded memory."""

PATCH_SHARE = 4
"""An answer is patched when at most 1/PATCH_SHARE of the rows changed, else recomputed."""

AnswerKey = tuple[tuple[tuple[ContainerKind, int], ...], AllocationPolicy]


class BulkDecisions:
    """Filter and prioritize over a :class:`NodeMatrix`."""

    def __init__(self, matrix: NodeMatrix) -> None:
        self.matrix = matrix
        self._answers: OrderedDict[AnswerKey, tuple[int, FleetPlacement, Ints]] = OrderedDict()
        self.node_by_node_below = NODE_BY_NODE_BELOW
        """Fewer rows than this (a patch, a small cluster) are placed row by row."""

    def filter(self, ask: PodAsk, names: Sequence[str]) -> FilterOutcome | None:
        """filter_nodes' answer, or None when this path cannot decide (see the module)."""
        answer = self._answer(ask)
        if answer is None:
            return None
        placed, _ = answer
        rows = self.matrix.rows_of(names)
        usable = self.matrix.usable(rows)
        fits = usable & placed.fits[rows]
        refused = usable & ~fits
        failed: dict[str, str] = {}
        refused_by: dict[int, int] = {}
        if refused.any():
            kinds, counts = np.unique(placed.outcome[rows[refused]], return_counts=True)
            refused_by = dict(zip(kinds.tolist(), counts.tolist(), strict=True))
            keys, inverse = distinct_rows(placed.refusal_keys(rows[refused]))
            words = np.array(node_reasons(keys, ask.containers), dtype=object)
            failed = dict(
                zip(compress(names, refused.tolist()), words[inverse].tolist(), strict=True)
            )
        unresolvable = {
            names[i]: self.matrix.problem(int(rows[i])) for i in np.flatnonzero(~usable).tolist()
        }
        return FilterOutcome(
            tuple(compress(names, fits.tolist())), failed, unresolvable, refused_by
        )

    def prioritize(self, ask: PodAsk, names: Sequence[str]) -> list[tuple[str, int]] | None:
        """prioritize's ``(node, score)`` list, or None when this path cannot decide."""
        answer = self._answer(ask)
        if answer is None:
            return None
        _, scores = answer
        rows = self.matrix.rows_of(names)
        found = np.where(self.matrix.usable(rows), scores[rows], 0)
        return list(zip(names, found.tolist(), strict=True))

    def _answer(self, ask: PodAsk) -> tuple[FleetPlacement, Ints] | None:
        """The pod on every row, kept per sizes and policy and patched row by row.

        Between two pods usually one node changed (the last bind's): an answer
        kept from before is recomputed on those rows only
        (:meth:`NodeMatrix.changed_since`), so the pods of one workload cost a
        gather, not a placement on every node.
        """
        self.matrix.sync()
        fleet = self.matrix.fleet()
        if fleet is None:
            return None
        key: AnswerKey = (tuple((c.kind, c.units) for c in ask.containers), ask.policy)
        kept = self._answers.get(key)
        if kept is not None:
            self._answers.move_to_end(key)
            version, placed, scores = kept
            if version == self.matrix.version:
                return placed, scores
            rows = self.matrix.changed_since(version)
            if rows is not None and rows.size * PATCH_SHARE <= placed.outcome.size:
                if rows.size:
                    part = fleet.subset(rows)
                    fresh = self._place(part, ask)
                    placed.patch(rows, fresh)
                    scores[rows] = fleet_scores(fresh, part, ask.policy)
                self._answers[key] = (self.matrix.version, placed, scores)
                return placed, scores
        placed = replace(self._place(fleet, ask), taken=None)
        scores = fleet_scores(placed, fleet, ask.policy)
        self._answers[key] = (self.matrix.version, placed, scores)
        if len(self._answers) > ANSWERS_KEPT:
            self._answers.popitem(last=False)
        return placed, scores

    def _place(self, fleet: Fleet, ask: PodAsk) -> FleetPlacement:
        return place_pod_on_fleet(
            fleet, ask.containers, ask.policy, node_by_node_below=self.node_by_node_below
        )
