"""``metagpu dev --dra``: its prompt, its claims and its scheduler (pure).

There is no API server in a dev session, so the claims live here, in memory, behind
the one method the DRA plugin reads them through (:meth:`DevClaims.read`, a
:data:`plugin.dra.servicer.ReadClaim`), and the slice is what the plugin would publish
(:meth:`plugin.dra.runtime.DraPlugin.plan`). Only two stand-ins, each as far as the
plugin reads it:

* a claim is what the controller-manager makes from the template the webhook's DRA
  mode names (:func:`webhook.dra.claim_template`): ``claim 0.5`` asks for 50 units and
  the memory the webhook would add (40Gi of an 80Gi GPU);
* :func:`allocate_claim` allocates as kube-scheduler v1.36.2 did with consumable
  capacity (``../shared/fixtures/dra/README.md``): the first device of the slice that
  has room, charged by its request policy (a capacity not asked for costs its default,
  a request rounds up to the step), one ``shareID`` per allocation; where nothing has
  room it answers with :func:`plugin.api.dra_waiting.waiting_words`, what metagpu says
  where the scheduler says only ``cannot allocate all claims``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from metagpu.dev_prompt import PromptError, Quit, ShowHelp
from plugin.api.dra_waiting import free_per_device, share_request, waiting_words
from plugin.api.quantity import MIB, QuantityError, format_mib, parse_quantity
from plugin.dra.claims import ClaimNotFoundError, ClaimRef
from plugin.dra.slices import MEMORY, UNITS

NAMESPACE: Final = "dev"
"""The namespace of every dev claim (a real claim lives in its pod's)."""
SCHEDULER_MESSAGE: Final = "cannot allocate all claims"
"""What kube-scheduler v1.36.2 said of every claim that did not fit (captured)."""

DRA_PROMPT_HELP: Final = """\
commands (DRA mode):
  claim 0.5 | claim 50 | claim 50 20Gi | claim 10Gi
                      create a claim as the webhook's DRA mode would write it
                      (units and the memory they get, or memory only)
  allocate 1          allocate claim 1 as kube-scheduler does (one share of one GPU),
                      or say why it would stay Pending
  prepare 1           the kubelet's NodePrepareResources for claim 1: the plugin's answer
                      and the CDI spec it wrote
  unprepare 1         NodeUnprepareResources: the spec is removed
  delete 1            unprepare and delete claim 1, freeing its share
  claims              every claim, its share and whether it is prepared
  slice               the ResourceSlice the plugin publishes, and what each GPU has free
  help                this text
  quit                stop (or Ctrl-C)"""


# ------------------------------------------------------------------ prompt
@dataclass(frozen=True)
class CreateClaim:
    units: int | None
    memory_mib: int | None
    asked: str


@dataclass(frozen=True)
class AllocateClaim:
    number: int


@dataclass(frozen=True)
class PrepareClaim:
    number: int


@dataclass(frozen=True)
class UnprepareClaim:
    number: int


@dataclass(frozen=True)
class DeleteClaim:
    number: int


@dataclass(frozen=True)
class ShowClaims:
    pass


@dataclass(frozen=True)
class ShowSlice:
    pass


DraCommand = (
    CreateClaim
    | AllocateClaim
    | PrepareClaim
    | UnprepareClaim
    | DeleteClaim
    | ShowClaims
    | ShowSlice
    | ShowHelp
    | Quit
)

_NUMBERED: Final[dict[str, type[AllocateClaim | PrepareClaim | UnprepareClaim | DeleteClaim]]] = {
    "allocate": AllocateClaim,
    "prepare": PrepareClaim,
    "unprepare": UnprepareClaim,
    "delete": DeleteClaim,
}
_SIMPLE: Final[dict[str, type[ShowClaims | ShowSlice | ShowHelp | Quit]]] = {
    "claims": ShowClaims,
    "slice": ShowSlice,
    "help": ShowHelp,
    "quit": Quit,
}
_MEMORY: Final = re.compile(r"^[0-9]{1,7}(Mi|Gi)$")
_UNITS: Final = re.compile(r"^[0-9]{1,7}(\.[0-9]{1,7})?$")


def parse_dra_prompt(line: str, *, units_per_gpu: int) -> DraCommand | None:
    """One line typed at the DRA prompt; None for a blank line. Raises PromptError
    with what would be accepted."""
    words = line.split()
    if not words:
        return None
    verb, args = words[0].lower(), words[1:]
    if verb in _SIMPLE:
        if args:
            raise PromptError(f"usage: {verb}")
        return _SIMPLE[verb]()
    if verb in _NUMBERED:
        if len(args) != 1:
            raise PromptError(f"usage: {verb} <claim number>")
        return _NUMBERED[verb](_claim_number(args[0]))
    if verb == "claim":
        return _claim(args, units_per_gpu=units_per_gpu)
    raise PromptError(f"unknown command {verb!r}; `help` lists them")


def _claim_number(text: str) -> int:
    digits = text.removeprefix("claim-")
    if not digits.isascii() or not digits.isdigit() or len(digits) > 6 or int(digits) < 1:
        raise PromptError(
            f"a claim number is a whole number >= 1 (as `claims` lists), not {text!r}"
        )
    return int(digits)


def _claim(args: list[str], *, units_per_gpu: int) -> CreateClaim:
    usage = "usage: claim <units or GPU fraction> [<memory, e.g. 20Gi>] | claim <memory>"
    if not 1 <= len(args) <= 2:
        raise PromptError(usage)
    units: int | None = None
    memory_mib: int | None = None
    for arg in args:
        if _MEMORY.match(arg) and memory_mib is None:
            memory_mib = int(parse_quantity(arg) // MIB)
            if memory_mib < 1:
                raise PromptError(f"memory must be at least 1Mi, not {arg}")
        elif _UNITS.match(arg) and units is None and memory_mib is None:
            units = _units(arg, units_per_gpu=units_per_gpu)
        else:
            raise PromptError(usage)
    return CreateClaim(units=units, memory_mib=memory_mib, asked=" ".join(args))


def _units(text: str, *, units_per_gpu: int) -> int:
    """``50`` is 50 units; ``0.5`` is half a GPU (a GPU is ``units_per_gpu`` units)."""
    try:
        amount = Decimal(text)
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only digits
        raise PromptError(f"not a GPU amount: {text!r}") from exc
    if "." in text:
        amount *= units_per_gpu
    if amount != amount.to_integral_value() or amount < 1:
        raise PromptError(f"{text} is not a whole number of units (a GPU is {units_per_gpu})")
    if amount > units_per_gpu:
        raise PromptError(
            f"{text} is more than one GPU: in DRA mode a claim is one share of one GPU"
        )
    return int(amount)


# ------------------------------------------------------------------ claims
@dataclass
class DevClaims:
    """The session's ResourceClaims, by number; :meth:`read` is what the plugin calls."""

    claims: dict[int, dict[str, Any]] = field(default_factory=dict)
    prepared: set[int] = field(default_factory=set)
    next_number: int = 1

    def create(self, spec: Mapping[str, Any]) -> int:
        """A new claim with ``spec`` (a ResourceClaim's), unallocated; its number."""
        number = self.next_number
        self.next_number += 1
        self.claims[number] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": f"claim-{number}",
                "namespace": NAMESPACE,
                "uid": str(uuid.uuid4()),
            },
            "spec": dict(spec),
            "status": {},
        }
        return number

    def get(self, number: int) -> dict[str, Any]:
        try:
            return self.claims[number]
        except KeyError:
            known = ", ".join(str(n) for n in sorted(self.claims)) or "none yet"
            raise PromptError(f"no claim {number} (claims: {known})") from None

    def ref(self, number: int) -> ClaimRef:
        meta = self.get(number)["metadata"]
        return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])

    def allocated(self) -> list[dict[str, Any]]:
        return [c for c in self.claims.values() if (c.get("status") or {}).get("allocation")]

    async def read(self, ref: ClaimRef) -> Mapping[str, Any]:
        """What the API server's GET of the claim would return (a plugin's
        :class:`plugin.dra.kube.ClaimReader`); a deleted claim is not found."""
        for claim in self.claims.values():
            meta = claim["metadata"]
            if meta["namespace"] == ref.namespace and meta["name"] == ref.name:
                return claim
        raise ClaimNotFoundError(f"claim {ref} not found")


# ------------------------------------------------------------------ scheduler
@dataclass(frozen=True)
class Allocated:
    """Where the scheduler put a claim."""

    allocation: dict[str, Any]
    device: str
    share_id: str
    units: int
    memory_mib: int


def allocate_claim(
    claim: Mapping[str, Any],
    *,
    slices: Iterable[Mapping[str, Any]],
    allocated: Iterable[Mapping[str, Any]],
    driver: str,
    node_name: str,
    share_id: str,
) -> Allocated | str:
    """The claim's allocation as kube-scheduler would write it, or why it does not fit.

    The first device in slice order with room for the charged amounts, as captured
    (50 + 50 went to gpu-0, the third 50 to gpu-1)."""
    free = free_per_device(slices, allocated, driver=driver, node_name=node_name)
    request = share_request(claim)
    for device in free:
        units = device.units.charge(request.units)
        memory = device.memory.charge(request.memory)
        if units <= device.units_free and memory <= device.memory_free:
            memory_mib = int(memory // MIB)
            consumed = {MEMORY: format_mib(memory_mib), UNITS: str(int(units))}
            result = {
                "request": _request_name(claim),
                "driver": driver,
                "pool": node_name,
                "device": device.device,
                "shareID": share_id,
                "consumedCapacity": consumed,
            }
            selector = {"key": "metadata.name", "operator": "In", "values": [node_name]}
            return Allocated(
                allocation={
                    "devices": {"results": [result]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [selector]}]},
                },
                device=device.device,
                share_id=share_id,
                units=int(units),
                memory_mib=memory_mib,
            )
    return waiting_words(free, request) or "no GPU device of this driver fits"


def _request_name(claim: Mapping[str, Any]) -> str:
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    return str(requests[0].get("name") or "") if requests else ""


def asked_of(claim: Mapping[str, Any]) -> str:
    """``units 50, memory 40Gi``: the claim's ``capacity.requests``, as typed in a template."""
    request = share_request(claim)
    parts = []
    if request.units is not None:
        parts.append(f"units {int(request.units)}")
    if request.memory is not None:
        parts.append(f"memory {format_mib(int(request.memory // MIB))}")
    return ", ".join(parts) or "no capacity (the policy defaults)"


def consumed_of(claim: Mapping[str, Any]) -> str | None:
    """``gpu-0 share 1f…: units 50, memory 40Gi``, or None when not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    if not results:
        return None
    shown = []
    for result in results:
        consumed = result.get("consumedCapacity") or {}
        try:
            units = int(parse_quantity(consumed.get(UNITS, "0")))
        except QuantityError:  # pragma: no cover - we wrote it
            units = 0
        shown.append(
            f"{result.get('device')} share {result.get('shareID')}: "
            f"units {units}, memory {consumed.get(MEMORY)}"
        )
    return "; ".join(shown)
