"""``metagpu dev``: the embedded default that ``make run`` starts.

Everything a newcomer needs to see metagpu work on one machine with no
cluster: the admission webhook on ``127.0.0.1:8443`` with a CA it generates,
the device plugin on simulated GPUs, and a simulated kubelet that the plugin
registers with and that allocates like the real one. The session itself lives
in :mod:`plugin.dev_session`; this module is the light CLI half (argparse and
the pure parsing of what is typed at the prompt), so ``metagpu --help`` stays
instant.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from plugin.api.commands import Command

# Pure (decimal and re only): the same exact conversion the webhook applies to
# `nvidia.com/gpu: 0.5`, so the prompt accepts exactly what a pod spec would.
from webhook.quantity import QuantityError, fraction_suggestion, parse_quantity, to_units

DEFAULT_RUN_DIR: Final = Path("run")
DEFAULT_LISTEN: Final = "127.0.0.1:8443"
EXAMPLE_GPUS_FILE: Final = Path(__file__).resolve().parent.parent / "examples" / "gpus.yaml"
"""The simulated node ``make run`` starts with: 4 × A100-80GB on two NUMA nodes."""

PROMPT_HELP: Final = """\
commands (type them here; Ctrl-C or `quit` stops everything):
  allocate 0.5      admit a container asking for half a GPU (also: 50 units, 1.5, 250m)
  release 1|all     end allocation #1 (or every allocation)
  devices           per-GPU health and free units, as the kubelet sees them
  xid 2 79          simulate XID 79 on GPU index 2 (appends it to the GPUs file)
  help              this list"""


class PromptError(ValueError):
    """A line typed at the dev prompt that is not a command; says what would be accepted."""


@dataclass(frozen=True)
class Allocate:
    units: int
    asked: str
    """What was typed (``0.5``), for the echo."""


@dataclass(frozen=True)
class Release:
    number: int | None
    """Allocation number, or None for all."""


@dataclass(frozen=True)
class ShowDevices:
    pass


@dataclass(frozen=True)
class InjectXid:
    gpu_index: int
    xid: int


@dataclass(frozen=True)
class ShowHelp:
    pass


@dataclass(frozen=True)
class Quit:
    pass


PromptCommand = Allocate | Release | ShowDevices | InjectXid | ShowHelp | Quit


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
    if verb == "allocate":
        if len(args) != 1:
            raise PromptError("usage: allocate <units or GPU fraction>, e.g. allocate 0.5")
        return Allocate(units=_units(args[0], units_per_gpu=units_per_gpu), asked=args[0])
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
    raise PromptError(f"unknown command {verb!r}; type `help` for the list")


def _units(text: str, *, units_per_gpu: int) -> int:
    if text.isdigit():
        units = int(text)
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
    if not text.isascii() or not text.isdigit() or (int(text) == 0 and not allow_zero):
        floor = "0" if allow_zero else "1"
        raise PromptError(f"{what} must be a whole number >= {floor}, got {text!r}")
    return int(text)


# ---------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help="where the generated CA, sockets and the editable GPUs file go (default %(default)s)",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help="webhook HOST:PORT (default %(default)s; port 0 picks a free one)",
    )
    parser.add_argument(
        "--gpus-file",
        type=Path,
        default=None,
        help="simulated GPUs to start from; copied into the run dir so it can be edited "
        f"(default {EXAMPLE_GPUS_FILE.relative_to(EXAMPLE_GPUS_FILE.parent.parent)})",
    )
    parser.add_argument(
        "--webhook-config", type=Path, default=None, help="webhook config file (optional)"
    )
    parser.add_argument(
        "--plugin-config", type=Path, default=None, help="device plugin config file (optional)"
    )


def run(args: argparse.Namespace) -> int:
    from plugin.dev_session import DevOptions, run_dev  # noqa: PLC0415 - grpc, aiohttp: not for --help

    return run_dev(
        DevOptions(
            run_dir=args.run_dir,
            listen=args.listen,
            gpus_file=args.gpus_file or EXAMPLE_GPUS_FILE,
            webhook_config=args.webhook_config,
            plugin_config=args.plugin_config,
        )
    )


COMMANDS = (
    Command(
        name="dev",
        help="the embedded default: webhook + device plugin on simulated GPUs",
        description=(
            "Run the webhook (generated CA, 127.0.0.1) and the device plugin on simulated\n"
            "GPUs against a simulated kubelet, in one process, with no cluster. Prints how\n"
            "to try it and reads commands on stdin.\n\n" + PROMPT_HELP
        ),
        add_arguments=add_arguments,
        run=run,
    ),
)
