"""The shape of a ``metagpu`` subcommand, shared by every component's CLI module.

Each component keeps a light ``cli`` module (argparse and the standard library
only at import time) that exposes ``COMMANDS``, a tuple of :class:`Command`.
Heavy imports (aiohttp, grpc, NVML) happen inside ``run``, so
``metagpu webhook`` never loads gRPC and ``metagpu mutate`` never loads aiohttp.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

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
