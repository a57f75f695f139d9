"""``metagpu dra-plugin``: flags and entry point (light: argparse and the config only at import).

Precedence as for ``device-plugin``: flags > env (``METAGPU_DRA_*``) > ``--config`` file >
defaults. gRPC, NVML and kubernetes-asyncio are imported inside :func:`run`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Final

from plugin.api.commands import (
    Command,
    add_config_file_argument,
    add_print_config_argument,
    add_switch,
    print_config,
    serve_until_signal,
)
from plugin.api.settings import ConfigError, load_config
from plugin.dra.config import CONFIG_FILE_ENV, ENV_PREFIX, DraConfig

DESCRIPTION: Final = """\
Serve GPUs through Dynamic Resource Allocation (Kubernetes >= 1.36, or 1.34-1.35 with the
DRAConsumableCapacity gate) as the kubelet plugin of driver gpu.metagpu.io.

Publishes one ResourceSlice for the node: one device per healthy GPU that many claims
share, each consuming part of its 'units' (100) and 'memory' capacities. Registers
through <plugins_registry>/<driver>-reg.sock, serves v1.DRAPlugin on
<plugins>/<driver>/dra.sock and writes one CDI spec per prepared share to the CDI
directory: the container runtime must support CDI (containerd >= 1.7 with CDI enabled,
containerd 2.x or CRI-O). Use --gpus-file to run on simulated GPUs.

Precedence: flags > env (METAGPU_DRA_*, e.g. METAGPU_DRA_NODE_NAME) > --config file >
defaults. See docs/dra.md."""

NODE_NAME_ENV: Final = "NODE_NAME"
"""The downward-API variable the chart sets; fallback for ``node_name``."""

OpenApi = Callable[[], AbstractAsyncContextManager[tuple[Any, str]]]
"""``certs.kube.open_api_client`` with no arguments, typed loosely to keep this module light."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_file_argument(parser, env_var=CONFIG_FILE_ENV, what="YAML config file")
    parser.add_argument("--node-name", metavar="NODE", help=f"this node (env {NODE_NAME_ENV})")
    parser.add_argument("--driver-name", metavar="NAME", help="the DRA driver name")
    parser.add_argument("--plugins-dir", type=Path, metavar="DIR", help="the kubelet's plugins dir")
    parser.add_argument(
        "--registry-dir", type=Path, metavar="DIR", help="the kubelet's plugins_registry dir"
    )
    parser.add_argument("--cdi-dir", type=Path, metavar="DIR", help="where CDI specs are written")
    parser.add_argument("--gpus-file", type=Path, metavar="FILE", help="simulated GPUs (YAML)")
    parser.add_argument("--units-per-gpu", type=int, metavar="N", help="the units capacity")
    add_switch(parser, "--health-checks", help="watch NVML for XID/ECC errors (health.enabled)")
    add_switch(
        parser, "--mps", help="hand shares CUDA MPS settings in their CDI specs (mps.enabled)"
    )
    add_switch(
        parser,
        "--mps-supervise",
        help="run and watch the MPS control daemon, GPUs in EXCLUSIVE_PROCESS (mps.supervise)",
    )
    add_print_config_argument(parser)


def load(args: argparse.Namespace) -> DraConfig:
    """The effective config; ``NODE_NAME`` fills ``node_name`` when nothing else did.
    Raises ConfigError."""
    flags: dict[str, object] = {
        "node_name": args.node_name,
        "driver_name": args.driver_name,
        "plugins_dir": args.plugins_dir,
        "registry_dir": args.registry_dir,
        "cdi_dir": args.cdi_dir,
        "gpus_file": args.gpus_file,
        "units_per_gpu": args.units_per_gpu,
        "health.enabled": args.health_checks,
        "mps.enabled": args.mps,
        "mps.supervise": args.mps_supervise,
    }
    config = load_config(
        DraConfig, file=args.config, env=os.environ, env_prefix=ENV_PREFIX, flags=flags
    )
    if config.node_name is None and os.environ.get(NODE_NAME_ENV):
        config = config.model_copy(update={"node_name": os.environ[NODE_NAME_ENV]})
    return config


def run(args: argparse.Namespace, *, open_api: OpenApi | None) -> int:
    config = load(args)
    if args.print_config:
        return print_config(config)
    if open_api is None:
        raise ConfigError("the DRA plugin needs the Kubernetes API (claims live there)")

    from plugin.dra.runtime import DraPlugin  # noqa: PLC0415 - gRPC, NVML, kubernetes-asyncio

    plugin = DraPlugin(config, open_api=open_api)

    async def serve(stop: asyncio.Event) -> None:
        await plugin.run(stop)

    return serve_until_signal(serve)


def dra_plugin_command(*, open_api: OpenApi | None) -> Command:
    """The ``dra-plugin`` command; ``open_api`` opens the Kubernetes API."""

    def run_plugin(args: argparse.Namespace) -> int:
        return run(args, open_api=open_api)

    return Command(
        name="dra-plugin",
        help="serve GPU shares through DRA (Kubernetes >= 1.36)",
        description=DESCRIPTION,
        add_arguments=add_arguments,
        run=run_plugin,
    )


COMMANDS: Final = (dra_plugin_command(open_api=None),)
"""Without the Kubernetes API; ``metagpu dra-plugin`` (:mod:`metagpu.dra_plugin`) hands in
the credentials loader."""
