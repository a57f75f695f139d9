"""The words filter gives each refused node, readable once kube-scheduler adds them up (pure).

kube-scheduler does not show ``FailedNodes`` as a list. It counts identical
reasons over all nodes and joins ``"<count> <reason>"`` in sorted order into
one message (``0/1000 nodes are available: 1 no single GPU has 70 free units
(largest 40; 80 free in total), 1 ...``), writes that whole message into the
pod's ``PodScheduled`` condition, and cuts the FailedScheduling event, which
``kubectl describe pod`` shows, at 1,024 bytes (``validation.NoteLengthLimit``).

Each node's own figures make its reason distinct from its neighbours'. On two
nodes that is the most useful thing to say; on 1,000 nodes it is 1,000
reasons, the event shows the first dozen in sort order (the nodes that quote
"largest 0"), the condition grows to tens of kilobytes, and what the user
needs (the largest free share on any node) is nowhere to be read.

So each node keeps its own words while all the distinct reasons fit
:data:`REASONS_BUDGET`; past it, the refusals of one rule, container and
asked amount share one sentence whose figures are ranges over those nodes:
``997 no single GPU has 70 free units (largest 10 to 60; 80 to 230 free in
total)``. If even that is too long (many containers refused for many
amounts), the amount becomes a range too. The words for one node alone
(bind's refusal) are never summarised.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from plugin.placement.refusals import NamedContainer, range_words, refusal_words

REASONS_BUDGET: Final = 640
"""Characters the distinct reasons may take in kube-scheduler's message, each with its
count and separator (``", 997 "``). The event is cut at 1,024 bytes, and the scheduler
adds its own text around ours: ``0/1000 nodes are available: `` and, after a failed
preemption attempt, ``preemption: 0/1000 nodes are available: 1000 No preemption
victims found for incoming pod.`` About 300 bytes are left to other plugins' reasons."""

_PER_REASON: Final = 7
"""What kube-scheduler adds around each distinct reason: ``", "`` and a count of up to
four digits and a space."""

_GROUPINGS: Final = (3, 2)
"""Leading columns of a refusal key that group refusals, in turn: (rule, container,
amount asked), then (rule, container)."""


def node_reasons(keys: npt.ArrayLike, containers: Sequence[NamedContainer]) -> list[str]:
    """The reason for each of ``keys``: distinct :data:`RefusalKey` s of the refused
    nodes, as rows of six integers (an array, or a list of tuples).

    Each key's own words while they all fit :data:`REASONS_BUDGET`, otherwise
    one sentence per group of keys (see the module docstring). Nodes with the
    same key always get the same words, so callers format per distinct key.
    Groups are runs of the keys sorted, their figures' ranges a ``reduceat``:
    a pod most nodes refuse has a hundred distinct refusals or more.
    """
    rows = np.asarray(keys, dtype=np.int64).reshape(-1, 6)
    own = _own_words(rows.tolist(), containers)
    if own is not None:
        return own
    order = np.lexsort(rows.T[::-1])
    ordered = rows[order]
    starts = np.ones(len(ordered), dtype=np.bool_)
    sentences: list[str] = []
    for width in _GROUPINGS:
        starts[1:] = (ordered[1:, :width] != ordered[:-1, :width]).any(axis=1)
        first = np.flatnonzero(starts)
        low = np.minimum.reduceat(ordered[:, 2:], first, axis=0).tolist()
        high = np.maximum.reduceat(ordered[:, 2:], first, axis=0).tolist()
        sentences = [
            range_words(kind, index, lo, hi, containers)
            for (kind, index), lo, hi in zip(ordered[first, :2].tolist(), low, high, strict=True)
        ]
        if _fits(sentences):
            break
    words = np.empty(len(rows), dtype=object)
    words[order] = np.array(sentences, dtype=object)[np.cumsum(starts) - 1]
    listed: list[str] = words.tolist()
    return listed


def _own_words(
    keys: Sequence[Sequence[int]], containers: Sequence[NamedContainer]
) -> list[str] | None:
    """Each key's own words, or None as soon as they would not fit the budget: a pod
    most nodes refuse has hundreds of distinct refusals, and formatting them all only
    to learn that they do not fit cost most of a millisecond per filter."""
    words: list[str] = []
    used = 0
    for key in keys:
        sentence = refusal_words(key, containers)
        used += len(sentence) + _PER_REASON
        if used > REASONS_BUDGET:
            return None
        words.append(sentence)
    return words


def _fits(words: Iterable[str]) -> bool:
    return sum(len(w) + _PER_REASON for w in set(words)) <= REASONS_BUDGET
