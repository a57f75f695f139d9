"""What a ResourceClaim's allocation gives this driver on this node (pure).

The kubelet's NodePrepareResources carries only ``{namespace, name, uid}``; the driver
reads the claim and finds its part in ``status.allocation.devices.results``: for each
result of this driver, the device, the request that caused it, the ``shareID`` the
scheduler generated for a multi-allocatable device and the ``consumedCapacity``
(``units`` and ``memory``; a capacity the claim did not request is charged its
policy default). Shape: ``../shared/fixtures/dra/claim-*-allocated.json``.

Every refusal is a :class:`ClaimError` whose text names the claim, because the
kubelet shows it verbatim in the pod's ``FailedPrepareDynamicResources`` event
(captured: ``NodePrepareResources failed for ResourceClaim perr-gpu-hr2wc: <ours>``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugin.api.quantity import QuantityError, bytes_to_mib, parse_quantity
from plugin.dra.slices import MEMORY, UNITS


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class AllocatedShare:
    """One allocation result of this driver: one device, or one share of it."""

    request: str
    pool: str
    device: str
    share_id: str | None
    """The scheduler's ``shareID``; None for a device allocated whole."""
    units: int | None
    """Consumed ``units``; None when the result carries no consumed capacity."""
    memory_mib: int | None
    """Consumed ``memory`` in MiB (floored); None when not carried."""


class ClaimError(Exception):
    """The claim cannot be prepared on this node; ``str()`` is the kubelet-facing text."""


class ClaimNotFoundError(ClaimError):
    """The API server has no such claim (deleted, or never created)."""


class ClaimMismatchError(ClaimError):
    """The claim exists but is not the one the kubelet asked for, or not for us."""


def shares_of(
    claim: Mapping[str, Any], *, ref: ClaimRef, driver: str, node_name: str
) -> tuple[AllocatedShare, ...]:
    """This driver's results in ``claim``'s allocation, checked against ``ref`` and the node.

    Raises :class:`ClaimMismatchError` when the UID differs (the claim was deleted and
    re-created under the same name), the claim is not allocated, the allocation is for
    another node, or none of its results belongs to ``driver``."""
    meta = claim.get("metadata") or {}
    uid = meta.get("uid")
    if uid != ref.uid:
        raise ClaimMismatchError(
            f"claim {ref} has UID {uid}, not {ref.uid}: it was deleted and re-created"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimMismatchError(f"claim {ref} is not allocated")
    nodes = allocated_nodes(allocation)
    if nodes is not None and node_name not in nodes:
        raise ClaimMismatchError(
            f"claim {ref} is allocated to node {', '.join(sorted(nodes)) or '(none)'}, "
            f"not {node_name}"
        )
    results = (allocation.get("devices") or {}).get("results") or []
    ours = [r for r in results if isinstance(r, dict) and r.get("driver") == driver]
    if not ours:
        raise ClaimMismatchError(f"claim {ref} has no device of driver {driver}")
    shares: list[AllocatedShare] = []
    for result in ours:
        pool = str(result.get("pool") or "")
        device = str(result.get("device") or "")
        if pool != node_name:
            raise ClaimMismatchError(
                f"claim {ref}: device {pool}/{device} is not in this node's pool {node_name}"
            )
        consumed = result.get("consumedCapacity") or {}
        try:
            units = int(parse_quantity(consumed[UNITS])) if UNITS in consumed else None
            memory = bytes_to_mib(consumed[MEMORY]) if MEMORY in consumed else None
        except QuantityError as exc:
            raise ClaimMismatchError(f"claim {ref}: device {device}: {exc}") from exc
        share_id = result.get("shareID")
        shares.append(
            AllocatedShare(
                request=str(result.get("request") or ""),
                pool=pool,
                device=device,
                share_id=str(share_id) if share_id else None,
                units=units,
                memory_mib=memory,
            )
        )
    return tuple(shares)


def allocated_nodes(allocation: Mapping[str, Any]) -> frozenset[str] | None:
    """The node names the allocation's ``nodeSelector`` pins it to with
    ``matchFields metadata.name In [...]`` (what the scheduler writes for node-local
    devices); None when it has no such term (a selector we do not interpret)."""
    terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms")) or []
    names: set[str] = set()
    found = False
    for term in terms:
        for field in (term or {}).get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                found = True
                names.update(str(v) for v in field.get("values") or [])
    return frozenset(names) if found else None
