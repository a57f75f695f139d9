"""What is typed at the ``metagpu dev`` prompt, parsed into commands (pure).

Apart from :mod:`metagpu.dev` (the command's flags) and
:mod:`metagpu.dev_session` (the running session) so that both can use it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# Pure (decimal and re only): the same exact conversion the webhook applies to
# `nvidia.com/gpu: 0.5`, so the prompt accepts exactly what a pod spec would.
from plugin.api.quantity import QuantityError, fraction_suggestion, parse_quantity, to_units

PROMPT_HELP: Final = """\
commands (type them here; Ctrl-C or `quit` stops everything):
  allocate 0.5      admit a container asking for half a GPU (also: 50 units, 1.5, 250m)
  schedule 0.7      ask the scheduler extender first: per-GPU free units, then the GPU it
                    assigns (or why the node is refused), then admit it on that GPU
  release 1|all     end allocation #1 (or every allocation)
  devices           per-GPU health and free units, as the kubelet sees them
  top               the node agent's picture: per GPU a bar for units, memory and SM, a row
                    per container (the live view: `metagpu top --socket …`, printed above)
  xid 2 79          simulate XID 79 on GPU index 2 (appends it to the GPUs file)
  other 1|none      pretend NVIDIA's device plugin also serves GPU index 1 (none: no GPU);
                    metagpu withdraws a GPU another plugin hands out
  mps kill          (with --mps) kill the MPS control daemon: watch its GPUs withdrawn
                    and the daemon restarted with its limits
  help              this list"""


class PromptError(ValueError):
    """A line typed at the dev prompt that is not a command; says what would be accepted."""


@dataclass(frozen=True)
class Allocate:
    units: int
    asked: str
    """What was typed (``0.5``), for the echo."""


@dataclass(frozen=True)
class Schedule:
    """Decide with the scheduler extender, then allocate (``schedule 0.7``)."""

    units: int
    asked: str


@dataclass(frozen=True)
class Release:
    number: int | None
    """Allocation number, or None for all."""


@dataclass(frozen=True)
class ShowDevices:
    pass


@dataclass(frozen=True)
class ShowTop:
    """One frame of ``metagpu top`` from the session's node agent."""


@dataclass(frozen=True)
class InjectXid:
    gpu_index: int
    xid: int


@dataclass(frozen=True)
class OtherPlugin:
    gpu_index: int | None
    """The GPU another device plugin (``nvidia.com/gpu``) also advertises; None: none."""


@dataclass(frozen=True)
class KillMpsDaemon:
    """SIGKILL the supervised MPS control daemon (``mps kill``)."""


@dataclass(frozen=True)
class ShowHelp:
    pass


@dataclass(frozen=True)
class Quit:
    pass


PromptCommand = (
    Allocate
    | Schedule
    | Release
    | ShowDevices
    | ShowTop
    | InjectXid
    | OtherPlugin
    | KillMpsDaemon
    | ShowHelp
    | Quit
)


def parse_prompt(line: str, *, units_per_gpu: int) -> PromptCommand | None:
    """Turn one typed line into a command; None for a blank line.

    ``allocate`` takes what a pod spec would: a whole number of units when it
    has no decimal point or suffix (``50``), otherwise a GPU fraction
    (``0.5``, ``500m``, ``1.5``) converted exactly as the webhook does.
    """
    words = line.split()
    if not words:
        return None
    verb, args = words[0].lower(), words[1:]
    if verb in ("help", "?", "h"):
        return ShowHelp()
    if verb in ("quit", "exit", "q"):
        return Quit()
    if verb in ("devices", "list", "ls"):
        return ShowDevices()
    if verb == "top":
        if args:
            raise PromptError("usage: top (takes no arguments)")
        return ShowTop()
    if verb == "allocate":
        if len(args) != 1:
            raise PromptError("usage: allocate <units or GPU fraction>, e.g. allocate 0.5")
        return Allocate(units=_units(args[0], units_per_gpu=units_per_gpu), asked=args[0])
    if verb == "schedule":
        if len(args) != 1:
            raise PromptError("usage: schedule <units or GPU fraction>, e.g. schedule 0.7")
        return Schedule(units=_units(args[0], units_per_gpu=units_per_gpu), asked=args[0])
    if verb == "release":
        if len(args) != 1:
            raise PromptError("usage: release <allocation number> | release all")
        if args[0].lower() == "all":
            return Release(number=None)
        return Release(number=_positive(args[0], what="allocation number"))
    if verb == "xid":
        if len(args) != 2:
            raise PromptError("usage: xid <gpu index> <xid>, e.g. xid 2 79")
        index = _positive(args[0], what="GPU index", allow_zero=True)
        return InjectXid(gpu_index=index, xid=_positive(args[1], what="XID"))
    if verb == "other":
        if len(args) != 1:
            raise PromptError("usage: other <gpu index> | other none, e.g. other 1")
        if args[0].lower() == "none":
            return OtherPlugin(gpu_index=None)
        return OtherPlugin(gpu_index=_positive(args[0], what="GPU index", allow_zero=True))
    if verb == "mps":
        if [a.lower() for a in args] != ["kill"]:
            raise PromptError("usage: mps kill")
        return KillMpsDaemon()
    raise PromptError(f"unknown command {verb!r}; type `help` for the list")


MAX_NUMBER_DIGITS = 9
"""Longer whole numbers are refused before ``int()``: no GPU has a billion units,
and Python refuses to convert 4,300 digits or more (a typo must not end the session)."""


def _whole_number(text: str, *, what: str) -> int | None:
    """``text`` as a whole number when it is ASCII digits (None otherwise).

    ASCII only: ``str.isdigit`` also accepts other scripts' digits and
    superscripts, which ``int()`` then reads or refuses in surprising ways.
    """
    if not (text.isascii() and text.isdigit()):
        return None
    if len(text) > MAX_NUMBER_DIGITS:
        raise PromptError(
            f"{what} {text[:12]}… has {len(text)} digits; at most {MAX_NUMBER_DIGITS} are accepted"
        )
    return int(text)


def _units(text: str, *, units_per_gpu: int) -> int:
    whole = _whole_number(text, what="amount")
    if whole is not None:
        units = whole
    else:
        try:
            value = parse_quantity(text)
        except QuantityError as exc:
            raise PromptError(f"not a GPU amount: {exc}") from exc
        converted = to_units(value, units_per_gpu)
        if converted is None:
            raise PromptError(
                f"{text} GPU is not a whole number of units at {units_per_gpu} per GPU; "
                f"try {fraction_suggestion(value, units_per_gpu)}"
            )
        units = converted
    if units <= 0:
        raise PromptError(f"allocate needs a positive amount, got {text}")
    return units


def _positive(text: str, *, what: str, allow_zero: bool = False) -> int:
    number = _whole_number(text, what=what)
    if number is None or (number == 0 and not allow_zero):
        floor = "0" if allow_zero else "1"
        shown = text if len(text) <= 40 else f"{text[:40]}… ({len(text)} characters)"
        raise PromptError(f"{what} must be a whole number >= {floor}, got {shown!r}")
    return number
