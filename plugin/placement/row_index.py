"""Where many meta-device IDs sit in a :class:`~.devices.DeviceTable`, found at once (pure).

Why this exists: the kubelet's ``GetPreferredAllocation`` carries every
available meta-device of the resource, 11,000 fresh strings on a 16 GPU ×
1000 unit node. Looking each one up in a ``dict`` of the table's 16,000 IDs
costs 260-340 ns in the plugin's process, against 95 ns in a warm loop:
every lookup ends by comparing the request's string with the table's own
string, and those 16,000 strings (about 2.5 MB with the dict) do not stay in
the CPU caches between two calls. That alone took the call past its 10 ms
target (docs/benchmarks.md).

So the index never touches the table's strings: it keeps the table's IDs'
``hash()`` values sorted in one 128 KB ``int64`` array, and maps a whole
request with one ``numpy.searchsorted``. Only the request's strings are read
(once, to hash them), while they are still in the cache from being created.

**What a hash match proves.** ``hash()`` of a ``str`` is a 64-bit keyed
SipHash whose key is drawn at random when the process starts. An unknown ID
is taken for a known one only when its hash equals one of the table's
hashes: about 1 in 10¹⁵ per ID, and nobody outside the process can aim for
it. Even then the allocator answers with the table's own IDs, the kubelet
intersects the answer with its available set, and ``Allocate`` validates
every ID exactly (:meth:`DeviceTable.lookup_all`). A table whose own IDs
share a hash (about 1 in 10¹¹ for 16,000 IDs) is looked up exactly, through
a ``dict``, as is every request that holds an ID the hashes do not know, so
that the error can name it.

``hash()`` of a ``str`` differs between processes. The plugin builds its
tables in the process that serves them; an index carried to another process
(pickled) no longer matches by hash and answers every request on the exact
path: slower, never wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

Rows = npt.NDArray[np.intp]
"""Table rows, one per ID asked about, in the order asked."""


class RowIndex:
    """The row of each ID in ``ids`` (the table's order), looked up in bulk."""

    def __init__(self, ids: Sequence[str], *, hasher: Callable[[str], int] = hash) -> None:
        """``hasher`` is ``hash`` in the plugin; tests pass one that collides,
        to drive the exact path."""
        self._hasher = hasher
        ids = tuple(ids)
        self._row_of = {device_id: row for row, device_id in enumerate(ids)}
        if len(self._row_of) != len(ids):
            raise ValueError("meta-device IDs must be unique")
        hashes = np.fromiter(map(hasher, ids), dtype=np.int64, count=len(ids))
        order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[order]
        self._rows: Rows = order.astype(np.intp)
        # Two IDs with one hash: the sorted array cannot tell them apart.
        self._by_hash = bool(ids) and bool(np.all(self._hashes[1:] != self._hashes[:-1]))

    @property
    def by_hash(self) -> bool:
        """Whether lookups go through the hashes (False: the exact ``dict`` path)."""
        return self._by_hash

    def of(self, ids: Sequence[str]) -> Rows:
        """The table row of each of ``ids``, in order (duplicates repeat).

        Raises ``KeyError`` whose argument is the first ID (in the order
        given) that is not in the table."""
        count = len(ids)
        if self._by_hash:
            hashes = np.fromiter(map(self._hasher, ids), dtype=np.int64, count=count)
            slots = np.searchsorted(self._hashes, hashes)
            np.minimum(slots, len(self._hashes) - 1, out=slots)
            if np.array_equal(self._hashes[slots], hashes):
                return self._rows[slots]
        # The exact path; for an unknown ID it raises KeyError(ID).
        return np.fromiter(map(self._row_of.__getitem__, ids), dtype=np.intp, count=count)
