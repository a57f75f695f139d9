"""Why a DRA claim waits: what each GPU of a node has free, in the extender's words (pure).

The scheduler says only ``0/1 nodes are available: 1 cannot allocate all claims``
(captured: ``../shared/fixtures/dra/event-70-units-unschedulable.json``, a 70-unit
claim beside two 60-unit shares of two 100-unit GPUs), for a claim too big for any one
GPU and for one above the request policy alike. Everything needed to say more is in
two objects the API server already has: the node's ResourceSlice(s) (each GPU's
``units`` and ``memory`` capacity and request policy) and the allocated claims'
``consumedCapacity``. :func:`free_per_device` subtracts the second from the first;
:func:`waiting_words` charges the waiting claim as the scheduler does (a capacity it did
not request is charged the policy default, a request rounds up to the step) and says,
in the words of :mod:`plugin.placement.refusals`, why no GPU takes it:
``no single GPU has 70 free units (largest 40; 80 free in total)``.

Kept apart from any transport, in ``plugin.api``, so that the webhook's Event writer
(:mod:`webhook.dra_waiting`, a leader-elected loop beside the claim-template
controller) and ``metagpu dev --dra`` say the same sentence. A pass over a busy cluster
costs one walk over the slices and the allocated claims (:class:`WaitingBoard`), then
one judgement per node for each distinct request, however many pods wait with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final

from plugin.api.quantity import MIB, QuantityError, format_mib, parse_quantity
from plugin.api.resources import DRA_MEMORY as MEMORY
from plugin.api.resources import DRA_UNITS as UNITS


@dataclass(frozen=True, slots=True)
class Capacity:
    """One consumable capacity of a device: its total and its request policy, in base
    units (units, or bytes for memory)."""

    total: Decimal
    default: Decimal
    minimum: Decimal
    step: Decimal

    def charge(self, requested: Decimal | None) -> Decimal:
        """What the scheduler consumes for ``requested`` (None: not requested): the
        default, or the request raised to the minimum and rounded up to the step
        (captured: 1500Mi was charged 2Gi)."""
        if requested is None:
            return self.default
        amount = max(requested, self.minimum)
        if self.step > 0:
            steps = ((amount - self.minimum) / self.step).to_integral_value(ROUND_CEILING)
            amount = self.minimum + steps * self.step
        return amount


@dataclass(frozen=True, slots=True)
class DeviceFree:
    """What one GPU device of the slice has left."""

    device: str
    units: Capacity
    memory: Capacity
    units_free: Decimal
    memory_free: Decimal

    @property
    def memory_free_mib(self) -> int:
        return int(self.memory_free // MIB)


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """What a waiting claim asks of one device; None where it does not say."""

    units: Decimal | None
    memory: Decimal | None
    """Bytes."""


def free_by_node(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    *,
    driver: str,
) -> dict[str, tuple[DeviceFree, ...]]:
    """Each node's GPU devices of ``driver``, less what the allocated ``claims``
    consumed on them, in one walk over both. A result without ``consumedCapacity``
    took the device whole (nothing left); results of other drivers or pools are not
    ours to count. Devices come in slice order, so the words list the GPUs as the
    slice does."""
    devices: dict[tuple[str, str], DeviceFree] = {}
    node_of: dict[tuple[str, str], str] = {}
    for piece in slices:
        spec = piece.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("driver") != driver or not node:
            continue
        pool = str((spec.get("pool") or {}).get("name") or "")
        for device in spec.get("devices") or []:
            capacity = device.get("capacity") or {}
            if UNITS not in capacity or MEMORY not in capacity:
                continue
            try:
                units, memory = _capacity(capacity[UNITS]), _capacity(capacity[MEMORY])
            except QuantityError:
                continue  # the API server validated it; a stranger's slice is not ours
            key = (pool, str(device.get("name")))
            node_of[key] = str(node)
            devices[key] = DeviceFree(
                device=str(device.get("name")),
                units=units,
                memory=memory,
                units_free=units.total,
                memory_free=memory.total,
            )
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != driver:
                continue
            key = (str(result.get("pool") or ""), str(result.get("device") or ""))
            found = devices.get(key)
            if found is None:
                continue
            consumed = result.get("consumedCapacity")
            if consumed is None:
                units_used, memory_used = found.units_free, found.memory_free
            else:
                units_used = _zero(consumed.get(UNITS))
                memory_used = _zero(consumed.get(MEMORY))
            devices[key] = DeviceFree(
                device=found.device,
                units=found.units,
                memory=found.memory,
                units_free=max(found.units_free - units_used, Decimal(0)),
                memory_free=max(found.memory_free - memory_used, Decimal(0)),
            )
    by_node: dict[str, list[DeviceFree]] = {}
    for key, free in devices.items():
        by_node.setdefault(node_of[key], []).append(free)
    return {node: tuple(free) for node, free in by_node.items()}


def free_per_device(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    *,
    driver: str,
    node_name: str,
) -> tuple[DeviceFree, ...]:
    """:func:`free_by_node` for one node."""
    mine = [s for s in slices if (s.get("spec") or {}).get("nodeName") == node_name]
    return free_by_node(mine, claims, driver=driver).get(node_name, ())


def share_request(claim: Mapping[str, Any]) -> ShareRequest:
    """The ``capacity.requests`` of the claim's first exactly-one-device request (the
    shape the webhook's DRA mode writes: one request, ``count: 1``)."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    for request in requests:
        exactly = request.get("exactly") or {}
        asked = (exactly.get("capacity") or {}).get("requests") or {}
        return ShareRequest(
            units=_amount(asked.get(UNITS)),
            memory=_amount(asked.get(MEMORY)),
        )
    return ShareRequest(units=None, memory=None)


def waiting_words(free: Sequence[DeviceFree], request: ShareRequest) -> str | None:
    """Why no device in ``free`` takes ``request``, or None when one does (the claim
    waits for something else: another claim of the pod, a node selector, a taint).

    Each device charges the request by its own policy. The first sentence is the
    extender's (``no single GPU has 70 free units (largest 40; 80 free in total)``);
    when units and memory each fit somewhere but never together, or no GPU is big enough
    at all, it says that instead; then what each GPU has free."""
    if not free:
        return "the node offers no GPU (its ResourceSlice has no devices)"
    fits = [
        d
        for d in free
        if d.units.charge(request.units) <= d.units_free
        and d.memory.charge(request.memory) <= d.memory_free
    ]
    if fits:
        return None
    units_need = max(d.units.charge(request.units) for d in free)
    memory_need = max(d.memory.charge(request.memory) for d in free)
    per_gpu = "; ".join(
        f"{d.device} {_n(d.units_free)} units, {format_mib(d.memory_free_mib)}" for d in free
    )
    tail = f" (free: {per_gpu})"
    if all(d.units.charge(request.units) > d.units.total for d in free):
        largest = max(d.units.total for d in free)
        return f"no GPU has {_n(units_need)} units (at most {_n(largest)} per GPU){tail}"
    if all(d.memory.charge(request.memory) > d.memory.total for d in free):
        largest = max(d.memory.total for d in free)
        return f"no GPU has {_mem(memory_need)} of memory (at most {_mem(largest)} per GPU){tail}"
    units_ok = any(d.units.charge(request.units) <= d.units_free for d in free)
    memory_ok = any(d.memory.charge(request.memory) <= d.memory_free for d in free)
    if not units_ok:
        largest = max(d.units_free for d in free)
        total = sum((d.units_free for d in free), Decimal(0))
        return (
            f"no single GPU has {_n(units_need)} free units "
            f"(largest {_n(largest)}; {_n(total)} free in total){tail}"
        )
    if not memory_ok:
        largest = max(d.memory_free for d in free)
        total = sum((d.memory_free for d in free), Decimal(0))
        return (
            f"no single GPU has {_mem(memory_need)} free memory "
            f"(largest {_mem(largest)}; {_mem(total)} free in total){tail}"
        )
    return (
        f"no single GPU has both {_n(units_need)} free units and "
        f"{_mem(memory_need)} free memory{tail}"
    )


def _capacity(raw: Mapping[str, Any]) -> Capacity:
    total = parse_quantity(raw.get("value"))
    policy = raw.get("requestPolicy") or {}
    valid = policy.get("validRange") or {}
    return Capacity(
        total=total,
        default=_zero(policy.get("default")),
        minimum=_zero(valid.get("min")),
        step=_zero(valid.get("step")),
    )


def _amount(raw: object) -> Decimal | None:
    """A quantity, or None when absent or unreadable (then it counts as not given)."""
    if raw is None:
        return None
    try:
        return parse_quantity(raw)
    except QuantityError:
        return None


def _zero(raw: object) -> Decimal:
    amount = _amount(raw)
    return Decimal(0) if amount is None else amount


def _n(value: Decimal) -> str:
    return str(int(value))


def _mem(value: Decimal) -> str:
    return format_mib(int(value // MIB))


MAX_NODE_NAMES: Final = 3
"""Node names spelled out per sentence; the rest are counted, so that the reason, which
follows the names, always fits the Event's 1 KiB note (1,000 nodes with one sentence
would otherwise fill it with names)."""


def _nodes(names: Sequence[str]) -> str:
    """``node-a, node-b``; ``n0, n1, n10 and 997 more nodes``."""
    if len(names) <= MAX_NODE_NAMES:
        return ", ".join(names)
    rest = len(names) - MAX_NODE_NAMES
    return f"{', '.join(names[:MAX_NODE_NAMES])} and {rest} more node{'s' if rest != 1 else ''}"


MAX_NODE_GROUPS: Final = 5
"""Sentences per claim in :func:`pod_waiting_words`; an Event's note holds 1 KiB, and
after five differing nodes the rest add little (their count is still given)."""


class WaitingBoard:
    """One pass's view: what every node's GPUs have free, and the words for each
    distinct request, worked out once however many pods wait with it."""

    MAX_REQUESTS: Final = 1024
    """Distinct requests remembered in one pass; past it the memo starts over (a
    namespace full of odd sizes costs time, never memory)."""

    def __init__(
        self, free: Mapping[str, Sequence[DeviceFree]], *, driver: str, device_class: str
    ) -> None:
        self._free = free
        self._nodes = sorted(free)
        self._driver = driver
        self._device_class = device_class
        self._memo: dict[ShareRequest, dict[str, str | None]] = {}

    @classmethod
    def of(
        cls,
        slices: Iterable[Mapping[str, Any]],
        allocated: Iterable[Mapping[str, Any]],
        *,
        driver: str,
        device_class: str,
    ) -> WaitingBoard:
        return cls(
            free_by_node(slices, allocated, driver=driver),
            driver=driver,
            device_class=device_class,
        )

    def per_node(self, request: ShareRequest) -> dict[str, str | None]:
        """Each node's refusal of ``request`` (None: a GPU there takes it)."""
        found = self._memo.get(request)
        if found is None:
            if len(self._memo) >= self.MAX_REQUESTS:
                self._memo.clear()
            found = {node: waiting_words(self._free[node], request) for node in self._nodes}
            self._memo[request] = found
        return found

    def waiting_claims(
        self, pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]]
    ) -> list[Mapping[str, Any]]:
        """The pod's unallocated claims that ask our DeviceClass for a device: those
        made from its templates (named in ``status.resourceClaimStatuses``) and those
        it names itself (``spec.resourceClaims[].resourceClaimName``)."""
        names = [
            str(entry.get("resourceClaimName") or "")
            for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        ] + [
            str(entry.get("resourceClaimName") or "")
            for entry in (pod.get("spec") or {}).get("resourceClaims") or []
        ]
        waiting = []
        for name in dict.fromkeys(n for n in names if n):
            claim = claims.get(name)
            if claim is None or (claim.get("status") or {}).get("allocation"):
                continue
            asked = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
            if any(
                (r.get("exactly") or {}).get("deviceClassName") == self._device_class for r in asked
            ):
                waiting.append(claim)
        return waiting

    def pod_words(
        self, pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]]
    ) -> str | None:
        """See :func:`pod_waiting_words`."""
        waiting = self.waiting_claims(pod, claims)
        if not waiting:
            return None
        if not self._nodes:
            return f"no node publishes a ResourceSlice of driver {self._driver}"
        refusals = [self.per_node(share_request(claim)) for claim in waiting]
        if any(all(r[node] is None for r in refusals) for node in self._nodes):
            return None
        sentences = []
        for claim, per_node in zip(waiting, refusals, strict=True):
            by_words: dict[str, list[str]] = {}
            for node in self._nodes:
                words = per_node[node]
                if words is not None:
                    by_words.setdefault(words, []).append(node)
            if not by_words:
                continue  # fits every node alone; another claim of the pod does not
            groups = sorted(by_words.items(), key=lambda item: item[1])
            shown = [f"{_nodes(ns)}: {words}" for words, ns in groups[:MAX_NODE_GROUPS]]
            more = sum(len(ns) for _, ns in groups[MAX_NODE_GROUPS:])
            tail = f"; and {more} more node{'s' if more != 1 else ''}" if more else ""
            name = (claim.get("metadata") or {}).get("name")
            sentences.append(f"claim {name}: " + "; ".join(shown) + tail)
        return " / ".join(sentences)


def pod_waiting_words(
    pod: Mapping[str, Any],
    *,
    claims: Mapping[str, Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    allocated: Sequence[Mapping[str, Any]],
    driver: str,
    device_class: str,
) -> str | None:
    """Why a Pending pod's claims of ``device_class`` fit no node's GPUs, for an Event on
    the pod; None when one of them has no claim waiting on us or some node takes every
    waiting claim (the pod waits for something else: a taint, a selector, CPU).

    ``claims`` are the pod's namespace's claims by name (the pod names its generated
    claims in ``status.resourceClaimStatuses``); ``slices`` are every node's slices of
    ``driver``; ``allocated`` every allocated claim. Nodes with the same sentence share it
    (``node-a, node-b: no single GPU has …``), as the extender words many nodes at once.
    Each claim is judged alone: two claims that each fit a GPU but not together are
    not explained here. Many pods at once: one :class:`WaitingBoard` for all of them."""
    board = WaitingBoard.of(slices, allocated, driver=driver, device_class=device_class)
    return board.pod_words(pod, claims)
