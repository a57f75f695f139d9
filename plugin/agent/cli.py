"""``metagpu agent``: flags and entry point (light: argparse and plugin.api only at import).

The agent reads the device plugin's config file (so resource names and units
per GPU agree) and its own ``agent:`` section. Precedence: **flags > env
(``METAGPU_PLUGIN_*``, e.g. ``METAGPU_PLUGIN_AGENT__INTERVAL_S``) > ``--config``
file > defaults**, with one addition: the node name also comes from the plain
``NODE_NAME`` variable (the downward API) when nothing else sets it.
aiohttp, gRPC, NVML and kubernetes-asyncio are imported inside :func:`run`.

The command is built by :func:`agent_command`, given how to open the Kubernetes
API: the umbrella ``metagpu`` (:mod:`metagpu.agent`) hands it
:func:`certs.kube.open_api_client`, which a module of plugin may not import.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

from plugin.api.agent_config import MEMORY_ENFORCEMENT_MODES
from plugin.api.commands import (
    Command,
    add_config_file_argument,
    add_print_config_argument,
    add_switch,
    print_config,
    serve_until_signal,
    version,
)
from plugin.api.config import CONFIG_FILE_ENV, ENV_PREFIX, PluginConfig
from plugin.api.settings import load_config

if TYPE_CHECKING:  # kubernetes-asyncio: not at import (``metagpu agent --help`` stays light)
    from plugin.agent.kube import ApiOpener

NODE_NAME_ENV: Final = "NODE_NAME"
"""The conventional downward-API variable (``fieldRef: spec.nodeName``)."""

DESCRIPTION: Final = """\
The metagpu node agent: who holds which GPU share and what they use.

Every interval it reads the GPUs (NVML, or --gpus-file), asks the kubelet's
PodResources API which container holds which meta-devices, maps GPU processes
to containers through /proc/<pid>/cgroup, and then: enforces GPU memory limits
(off | report | kill), exports Prometheus metrics on --metrics-listen, keeps the
metagpu.io/* Node labels current, and answers mgctl on <socket-dir>/agent.sock.
Run it with hostPID (PIDs must be host PIDs) on every node the device plugin
runs on; the Helm chart gives it a DaemonSet of its own, the only pod there
with hostPID.

Precedence: flags > env (METAGPU_PLUGIN_*, e.g. METAGPU_PLUGIN_AGENT__INTERVAL_S)
> --config file > defaults; NODE_NAME is the last fallback for --node-name.
See docs/agent.md for every setting."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``agent`` flags; each maps to a config field (None = not given)."""
    add_config_file_argument(
        parser, env_var=CONFIG_FILE_ENV, what="YAML config file shared with the device plugin"
    )
    parser.add_argument(
        "--node-name", metavar="NAME", help=f"this node's name (env {NODE_NAME_ENV})"
    )
    parser.add_argument("--gpus-file", type=Path, metavar="FILE", help="simulated GPUs (YAML)")
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        metavar="PATH",
        help="kubelet PodResources socket (default /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    parser.add_argument(
        "--socket-dir",
        type=Path,
        metavar="DIR",
        help="directory for agent.sock and mgctl (default /var/run/metagpu)",
    )
    parser.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="metrics and probes (default 0.0.0.0:9400)"
    )
    parser.add_argument(
        "--interval", type=float, metavar="SECONDS", help="seconds between cycles (default 5)"
    )
    parser.add_argument(
        "--memory-enforcement",
        choices=MEMORY_ENFORCEMENT_MODES,
        help="what to do about a container over its GPU memory share (default report)",
    )
    parser.add_argument(
        "--kill-grace",
        type=float,
        metavar="SECONDS",
        help="how long an overrun must last before 'kill' acts (default 30)",
    )
    parser.add_argument("--proc-root", type=Path, metavar="DIR", help="procfs (default /proc)")
    add_switch(
        parser, "--label-node", help="keep the metagpu.io/* Node labels current (default on)"
    )
    add_switch(
        parser,
        "--install-mgctl",
        help="copy mgctl into the socket directory at start-up (default on)",
    )
    add_print_config_argument(parser)


def config_flags(args: argparse.Namespace) -> dict[str, object]:
    """Dotted config paths → flag values, for :func:`plugin.api.settings.load_config`."""
    return {
        "gpus_file": args.gpus_file,
        "agent.node_name": args.node_name,
        "agent.pod_resources_socket": args.pod_resources_socket,
        "agent.socket_dir": args.socket_dir,
        "agent.metrics_listen": args.metrics_listen,
        "agent.interval_s": args.interval,
        "agent.memory_enforcement": args.memory_enforcement,
        "agent.kill_grace_s": args.kill_grace,
        "agent.proc_root": args.proc_root,
        "agent.label_node": args.label_node,
        "agent.install_mgctl": args.install_mgctl,
    }


def load(args: argparse.Namespace) -> PluginConfig:
    """The effective config. Raises :class:`~plugin.api.settings.ConfigError`."""
    flags = config_flags(args)
    config = load_config(
        PluginConfig, file=args.config, env=os.environ, env_prefix=ENV_PREFIX, flags=flags
    )
    if config.agent.node_name is None and os.environ.get(NODE_NAME_ENV):
        flags["agent.node_name"] = os.environ[NODE_NAME_ENV]
        config = load_config(
            PluginConfig, file=args.config, env=os.environ, env_prefix=ENV_PREFIX, flags=flags
        )
    return config


def run(args: argparse.Namespace, *, open_api: ApiOpener) -> int:
    config = load(args)  # a bad config fails here: exit 2 via the dispatcher
    if args.print_config:
        return print_config(config)

    from plugin.agent.agent import serve  # noqa: PLC0415 - heavy: aiohttp, grpc, kubernetes

    return serve_until_signal(
        lambda stop: serve(config, stop=stop, open_api=open_api, version=version())
    )


def agent_command(*, open_api: ApiOpener) -> Command:
    """The ``agent`` command, opening the Kubernetes API with ``open_api``."""

    def run_agent(args: argparse.Namespace) -> int:
        return run(args, open_api=open_api)

    return Command(
        name="agent",
        help="node agent: usage accounting, enforcement, labels, metrics",
        description=DESCRIPTION,
        add_arguments=add_arguments,
        run=run_agent,
    )
