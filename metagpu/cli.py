"""``metagpu``: the one command for every server-side component.

``metagpu <command> [flags]``. The dispatcher knows each command's module and
one-line help without importing it, and imports only the module of the
command being run, so the webhook never loads gRPC or NVML and ``--help`` is
instant. Logging flags are shared by every command (``--log-level``,
``--log-format``, with ``METAGPU_LOG_LEVEL``/``METAGPU_LOG_FORMAT`` fallbacks).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Final

from plugin.api.commands import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Command,
    version,
)
from plugin.api.logs import LOG_FORMATS, LOG_LEVELS, configure_logging
from plugin.api.settings import ConfigError

# The name it had before plugin/ was split by concern: log lines (text and JSON
# show the logger) and any logging config that names it stay as they were.
logger = logging.getLogger("plugin.cli")

# command name -> (module holding COMMANDS, one-line help for the listing)
COMMAND_MODULES: Final[dict[str, tuple[str, str]]] = {
    "webhook": ("webhook.cli", "serve the mutating admission webhook over HTTPS"),
    "mutate": (
        "webhook.cli",
        "apply the webhook's rules to a pod file offline and show the result",
    ),
    "quota-mirror": ("webhook.cli", "keep a ResourceQuota in metagpu units beside each GPU quota"),
    "certs": ("certs.cli", "generate, bootstrap and inspect the webhook's TLS certificates"),
    "device-plugin": ("metagpu.device_plugin", "serve meta-devices to the kubelet (v1beta1)"),
    "dra-plugin": (
        "metagpu.dra_plugin",
        "serve GPU shares through DRA (Kubernetes >= 1.36)",
    ),
    "agent": ("metagpu.agent", "node agent: usage accounting, enforcement, labels, metrics"),
    "scheduler-extender": (
        "metagpu.scheduler_extender",
        "GPU-aware kube-scheduler extender: one GPU per fraction",
    ),
    "dev": ("metagpu.dev", "the embedded default: webhook + device plugin on simulated GPUs"),
    "usage": (
        "metagpu.usage_cli",
        "GPU-hours allocated and used, and right-sizing, from Prometheus",
    ),
    "top": ("metagpu.top", "a live view of this node's GPUs and shares, like top"),
    "cleanup": (
        "metagpu.cleanup.cli",
        "remove the node labels, Leases and claim templates metagpu wrote (uninstall hook)",
    ),
}


def common_parser() -> argparse.ArgumentParser:
    """Flags every command accepts, added as an argparse parent."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("METAGPU_LOG_LEVEL", "INFO").upper(),
        help="minimum level to log (env METAGPU_LOG_LEVEL; default %(default)s)",
    )
    group.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=os.environ.get("METAGPU_LOG_FORMAT", "text"),
        help="text for people, json for log collectors (env METAGPU_LOG_FORMAT; "
        "default %(default)s)",
    )
    return parent


def find_command(name: str) -> Command:
    """Import the module that owns ``name`` and return its :class:`Command`."""
    module_name, _ = COMMAND_MODULES[name]
    module = importlib.import_module(module_name)
    commands: tuple[Command, ...] = module.COMMANDS
    for command in commands:
        if command.name == name:
            return command
    raise LookupError(f"{module_name} does not define the {name!r} command")


def usage() -> str:
    """The top-level help: every command and its one-line description."""
    width = max(map(len, COMMAND_MODULES))
    lines = [
        "usage: metagpu <command> [flags]   (metagpu <command> --help for its flags)",
        "",
        "Fractional GPU sharing for Kubernetes.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMAND_MODULES.items()]
    lines += ["", "  --version  print the version and exit"]
    return "\n".join(lines)


def build_parser(command: Command) -> argparse.ArgumentParser:
    """The full parser for one command, with the shared logging flags."""
    parser = argparse.ArgumentParser(
        prog=f"metagpu {command.name}",
        description=command.description or command.help,
        parents=[common_parser()],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``metagpu`` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else EXIT_USAGE
    if args[0] == "--version":
        print(f"metagpu {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMAND_MODULES:
        print(
            f"metagpu: unknown command {name!r}; choose one of: {', '.join(COMMAND_MODULES)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    command = find_command(name)
    parsed = build_parser(command).parse_args(rest)
    configure_logging(level=parsed.log_level, fmt=parsed.log_format)
    try:
        return command.run(parsed)
    except ConfigError as exc:
        print(f"metagpu {name}: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception:
        logger.exception("metagpu %s failed", name)
        return EXIT_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
