"""The shape of a ``metagpu`` subcommand, shared by every component's CLI module.

Each component keeps a light ``cli`` module (argparse and the standard library
only at import time) that exposes ``COMMANDS``, a tuple of :class:`Command`
(the node agent's is built by :mod:`metagpu.agent`, which hands it the
Kubernetes credentials loader of certs).
Heavy imports (aiohttp, grpc, NVML) happen inside ``run``, so
``metagpu webhook`` never loads gRPC and ``metagpu mutate`` never loads aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a light module: building a parser must not import pydantic
    from pydantic import BaseModel

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
"""Bad flags or bad configuration: the operator must change something."""
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one-line help, flag set-up and entry point."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None
    """Longer text for ``--help``; the first paragraph of the help otherwise."""


def version() -> str:
    """The installed package version, or ``unknown`` when run from a bare tree.

    Here, not in the umbrella ``metagpu`` command, because components report it
    too (the node agent stamps it into ``mgctl``) and no component may import
    the umbrella.
    """
    try:
        return metadata.version("metagpu")
    except metadata.PackageNotFoundError:
        return "unknown"


def add_config_file_argument(
    parser: argparse.ArgumentParser, *, env_var: str, what: str = "YAML config file"
) -> None:
    """``--config FILE``, falling back to ``$env_var`` (how a DaemonSet points at its ConfigMap)."""
    parser.add_argument(
        "--config",
        type=Path,
        default=os.environ.get(env_var) or None,
        metavar="FILE",
        help=f"{what} (env {env_var})",
    )


def add_switch(parser: argparse.ArgumentParser, flag: str, *, help: str) -> None:
    """``--flag`` / ``--no-flag``; left out, it is None, so env, file or default decide
    (:func:`plugin.api.settings.load_config` skips None flags)."""
    parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help)


def add_print_config_argument(parser: argparse.ArgumentParser) -> None:
    """``--print-config``: show the effective configuration (after flags > env > file)."""
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration as JSON and exit",
    )


def print_config(config: BaseModel) -> int:
    """What ``--print-config`` prints: the validated model as indented JSON."""
    json.dump(config.model_dump(mode="json"), sys.stdout, indent=2)
    print()
    return EXIT_OK


def freeze_heap() -> None:
    """Collect once, then keep everything alive now out of the collector's full passes.

    For what lives as long as the process: the modules imported at start-up, and
    a component's first full picture of the cluster (the extender's ledger of
    every node, once listed). The full passes walk every object not frozen, so
    each such object left unfrozen adds to every later pause.
    """
    gc.collect()
    gc.freeze()


def serve_until_signal(serve: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run ``serve(stop)`` until SIGTERM or SIGINT sets ``stop``; exit status 0.

    The heap is frozen first: everything imported by now (kubernetes-asyncio
    alone is thousands of classes) lives as long as the process, and the
    collector's full passes would otherwise walk it again and again, adding
    50-100 ms pauses (tests/benchmarks/agent_cycle.py). Signals are handled here,
    at the top, and nowhere else: they set the stop event and the runtime shuts
    down in order (sockets removed, requests answered).
    """
    freeze_heap()

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(stop)
        return EXIT_OK

    return asyncio.run(main())
