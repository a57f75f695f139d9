"""The ledger's node views as numpy rows, for placing a pod on every node at once.

:mod:`plugin.placement.fleet` decides for all nodes in a few array passes;
this keeps the arrays it reads (a :class:`~plugin.placement.fleet.Fleet`) equal
to :meth:`Ledger.view <plugin.extender.ledger.Ledger.view>` of every node, by
rewriting only the rows of nodes the ledger says changed since the last call
(:meth:`Ledger.take_changed`): between two pods that is usually the one node
the last bind went to, not the 1,000 others.

A node without a usable view (no ledger annotation, an unreadable one) keeps a
row with nothing free and the ledger's reason beside it; a node that is gone
gives its row back for reuse, so memory follows the node count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from plugin.extender.ledger import NO_LEDGER, Ledger, NodeView
from plugin.placement.fleet import NO_NUMA, Bools, Fleet, Ints, gpu_row

CHANGE_LOG: Final = 256
"""Syncs remembered row by row; an answer older than that is computed afresh."""

MAX_NUMA_COLUMNS: Final = 16
"""Distinct NUMA nodes across the cluster the vectorised path handles (real machines have
1-8); past it :meth:`NodeMatrix.fleet` answers None and callers place node by node."""


class NodeMatrix:
    """Rows of free units, NUMA nodes and health per node, in step with a :class:`Ledger`."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._row: dict[str, int] = {}
        self._spare: list[int] = []
        self._rows = 0
        self._problem: dict[int, str] = {}
        self._numa_keys: list[int] = [NO_NUMA]
        self._free = np.zeros((0, 0), dtype=np.int64)
        self._numa_raw = np.full((0, 0), NO_NUMA, dtype=np.int64)
        self._numa = np.zeros((0, 0), dtype=np.int64)
        self._upg = np.ones(0, dtype=np.int64)
        self._unhealthy = np.zeros(0, dtype=np.int64)
        self._healthy = np.zeros(0, dtype=np.int64)
        self._usable = np.zeros(0, dtype=np.bool_)
        self._fleet: Fleet | None = None
        self._primed = False
        self.version = 0
        """Changes whenever any row does: answers computed on the fleet are valid until then."""
        self._epoch = 0
        """The version since which the rows kept their number and width (answers computed
        before it cannot be patched row by row)."""
        self._log: deque[tuple[int, Ints]] = deque(maxlen=CHANGE_LOG)

    # ---------------------------------------------------------------- sync
    def sync(self) -> None:
        """Rewrite the rows of nodes changed since the last sync (all of them the first time)."""
        changed = self._ledger.take_changed()
        if changed is None or not self._primed:
            changed = set(self._row) | set(self._ledger.node_names())
            self._primed = True
        if not changed:
            return
        shape = (self._rows, self._free.shape[1], len(self._numa_keys))
        rows: set[int] = set()
        for name in changed:
            row = self._row.get(name)
            if self._ledger.has_node(name):
                self._write(name, self._ledger.view(name))
                row = self._row[name]
            else:
                self._release(name)
            if row is not None:
                rows.add(row)
        self.version += 1
        self._fleet = None
        if shape != (self._rows, self._free.shape[1], len(self._numa_keys)):
            self._epoch = self.version
            self._log.clear()
        else:
            self._log.append((self.version, np.fromiter(rows, dtype=np.int64, count=len(rows))))

    def changed_since(self, version: int) -> Ints | None:
        """Rows rewritten after ``version``; None when that cannot be told (rows were
        added, the width or the NUMA nodes changed, or the log no longer reaches back)."""
        if version < self._epoch or version > self.version:
            return None
        if version == self.version:
            return np.zeros(0, dtype=np.int64)
        if not self._log or self._log[0][0] > version + 1:
            return None
        parts = [rows for logged, rows in self._log if logged > version]
        return np.unique(np.concatenate(parts))

    def fleet(self) -> Fleet | None:
        """Every row as a Fleet (after :meth:`sync`); None past :data:`MAX_NUMA_COLUMNS`."""
        if len(self._numa_keys) > MAX_NUMA_COLUMNS:
            return None
        if self._fleet is None:
            n = self._rows
            self._fleet = Fleet(
                free=self._free[:n],
                numa=self._numa[:n],
                units_per_gpu=self._upg[:n],
                unhealthy=self._unhealthy[:n],
                healthy=self._healthy[:n],
                numa_columns=len(self._numa_keys),
            )
        return self._fleet

    # -------------------------------------------------------------- lookups
    def rows_of(self, names: Sequence[str]) -> Ints:
        """Each name's row, -1 for a node the ledger has never seen.

        One ``itemgetter`` call for the usual request, whose names are all known:
        half the cost of a ``get`` per name (measured at 1,000 names, 46 against
        101 µs); a name never seen sends it the per-name way.
        """
        if len(names) > 1:
            try:
                known: Ints = np.array(itemgetter(*names)(self._row), dtype=np.int64)
            except KeyError:
                pass
            else:
                return known
        rows: Ints = np.fromiter(
            map(self._row.get, names, repeat(-1, len(names))), dtype=np.int64, count=len(names)
        )
        return rows

    def usable(self, rows: Ints) -> Bools:
        """Rows with a view to place on (-1, unknown, is not)."""
        found: Bools = (rows >= 0) & self._usable[np.maximum(rows, 0)]
        return found

    def problem(self, row: int) -> str:
        """Why a row that is not :meth:`usable` has nothing to place on."""
        if row < 0:
            return NO_LEDGER
        return self._problem.get(row, NO_LEDGER)

    # ------------------------------------------------------------ internals
    def _write(self, name: str, view: NodeView | str) -> None:
        row = self._row.get(name)
        if row is None:
            row = self._spare.pop() if self._spare else self._grow_rows()
            self._row[name] = row
        if isinstance(view, str):
            self._problem[row] = view
            self._clear(row)
            return
        self._problem.pop(row, None)
        width = len(view.gpus)
        if width > self._free.shape[1]:
            self._grow_width(width)
        free, keys, healthy = gpu_row(view.gpus)
        if any(key not in self._numa_keys for key in keys):
            self._numa_keys = sorted(set(self._numa_keys) | set(keys))
            self._recode()
        self._clear(row)
        self._free[row, :width] = free
        self._numa_raw[row, :width] = keys
        self._numa[row] = np.searchsorted(self._numa_keys, self._numa_raw[row])
        self._upg[row] = view.units_per_gpu
        self._healthy[row] = healthy
        self._unhealthy[row] = width - healthy
        self._usable[row] = True

    def _release(self, name: str) -> None:
        row = self._row.pop(name, None)
        if row is None:
            return
        self._problem.pop(row, None)
        self._clear(row)
        self._spare.append(row)

    def _clear(self, row: int) -> None:
        """Nothing free, one unit per GPU (a Fleet needs at least one), no view."""
        self._free[row] = 0
        self._numa_raw[row] = NO_NUMA
        self._numa[row] = len(self._numa_keys) - 1
        self._upg[row] = 1
        self._healthy[row] = 0
        self._unhealthy[row] = 0
        self._usable[row] = False

    def _recode(self) -> None:
        self._numa = np.searchsorted(self._numa_keys, self._numa_raw).astype(np.int64)

    def _grow_rows(self) -> int:
        row = self._rows
        self._rows += 1
        if row >= self._free.shape[0]:
            size = max(64, 2 * self._free.shape[0])
            width = self._free.shape[1]
            self._free = _resized(self._free, (size, width), 0)
            self._numa_raw = _resized(self._numa_raw, (size, width), NO_NUMA)
            self._numa = _resized(self._numa, (size, width), 0)
            self._upg = _resized(self._upg, (size,), 1)
            self._unhealthy = _resized(self._unhealthy, (size,), 0)
            self._healthy = _resized(self._healthy, (size,), 0)
            self._usable = _resized(self._usable, (size,), False)
        return row

    def _grow_width(self, width: int) -> None:
        rows = self._free.shape[0]
        self._free = _resized(self._free, (rows, width), 0)
        self._numa_raw = _resized(self._numa_raw, (rows, width), NO_NUMA)
        self._recode()


def _resized(array: npt.NDArray[Any], shape: tuple[int, ...], fill: object) -> npt.NDArray[Any]:
    grown = np.full(shape, fill, dtype=array.dtype)
    grown[tuple(slice(0, n) for n in array.shape)] = array
    return grown
