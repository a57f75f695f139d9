"""``metagpu device-plugin``: flags and entry point (light: argparse and plugin.api only at import).

Configuration precedence is NVIDIA's: **flags > env (``METAGPU_PLUGIN_*``) >
``--config`` file > defaults**. SIGHUP re-reads the same file and environment
and re-applies the same flags, so a flag always wins, also after a reload.
gRPC, NVML and the supervisor are imported inside :func:`run`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Final, get_args

from plugin.api.commands import (
    Command,
    add_config_file_argument,
    add_print_config_argument,
    add_switch,
    print_config,
)
from plugin.api.config import (
    CONFIG_FILE_ENV,
    ENV_PREFIX,
    AllocationPolicy,
    DeviceIdStrategy,
    DeviceListStrategy,
    PluginConfig,
)
from plugin.api.settings import load_config

DESCRIPTION: Final = """\
Serve meta-devices to the kubelet over the device plugin API v1beta1.

Each GPU is advertised as units_per_gpu meta-devices of the configured
resource (default cnvrg.io/metagpu, 100 per GPU). The plugin serves on
<device-plugins-dir>/metagpu-<name>.sock, registers with kubelet.sock,
re-registers when the kubelet restarts, reloads its config on SIGHUP and
removes its sockets on SIGTERM. Use --gpus-file to run on simulated GPUs.

Precedence: flags > env (METAGPU_PLUGIN_*, e.g. METAGPU_PLUGIN_UNITS_PER_GPU,
METAGPU_PLUGIN_HEALTH__RECOVERY_S) > --config file > defaults.
See docs/device-plugin.md for every setting."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``device-plugin`` flags; each one maps to a config field (None = not given)."""
    add_config_file_argument(parser, env_var=CONFIG_FILE_ENV, what="YAML config file")
    parser.add_argument(
        "--device-plugins-dir",
        type=Path,
        metavar="DIR",
        help="the kubelet's device-plugins directory (default /var/lib/kubelet/device-plugins)",
    )
    parser.add_argument(
        "--gpus-file",
        type=Path,
        metavar="FILE",
        help="simulated GPUs (YAML) instead of NVML",
    )
    parser.add_argument(
        "--resource-name",
        metavar="NAME",
        help="advertise one resource with this name on all GPUs (replaces 'resources')",
    )
    parser.add_argument("--units-per-gpu", type=int, metavar="N", help="meta-devices per GPU")
    parser.add_argument("--allocation-policy", choices=get_args(AllocationPolicy))
    add_switch(
        parser,
        "--allow-split-fraction",
        help="a fraction split across GPUs is expected rather than a warning",
    )
    parser.add_argument("--device-id-strategy", choices=get_args(DeviceIdStrategy))
    parser.add_argument("--device-list-strategy", choices=get_args(DeviceListStrategy))
    add_switch(
        parser,
        "--fail-on-init-error",
        help="exit when the GPU driver fails to initialise (else advertise nothing and wait)",
    )
    add_switch(parser, "--health-checks", help="watch NVML for XID/ECC errors (health.enabled)")
    add_switch(parser, "--mps", help="hand containers CUDA MPS settings (mps.enabled)")
    add_switch(
        parser,
        "--mps-supervise",
        help="run and watch the MPS control daemon, GPUs in EXCLUSIVE_PROCESS (mps.supervise)",
    )
    add_print_config_argument(parser)


def config_flags(args: argparse.Namespace) -> dict[str, object]:
    """Dotted config paths → flag values, for :func:`plugin.api.settings.load_config`."""
    resources = [{"name": args.resource_name}] if args.resource_name else None
    return {
        "device_plugins_dir": args.device_plugins_dir,
        "gpus_file": args.gpus_file,
        "resources": resources,
        "units_per_gpu": args.units_per_gpu,
        "allocation_policy": args.allocation_policy,
        "allow_split_fraction": args.allow_split_fraction,
        "device_id_strategy": args.device_id_strategy,
        "device_list_strategy": args.device_list_strategy,
        "fail_on_init_error": args.fail_on_init_error,
        "health.enabled": args.health_checks,
        "mps.enabled": args.mps,
        "mps.supervise": args.mps_supervise,
    }


NODE_NAME_ENV: Final = "NODE_NAME"
"""The downward-API variable the chart sets; fallback for ``placement.node_name``."""

OpenApi = Callable[[], AbstractAsyncContextManager[tuple[Any, str]]]
"""``certs.kube.open_api_client`` with no arguments (:data:`plugin.kube.errors.ApiOpener`),
typed loosely here so this module stays light."""


def load(args: argparse.Namespace) -> PluginConfig:
    """The effective config now (re-run on SIGHUP). Raises ConfigError."""
    flags = config_flags(args)
    config = load_config(
        PluginConfig, file=args.config, env=os.environ, env_prefix=ENV_PREFIX, flags=flags
    )
    if config.placement.node_name is None and os.environ.get(NODE_NAME_ENV):
        flags["placement.node_name"] = os.environ[NODE_NAME_ENV]
        config = load_config(
            PluginConfig, file=args.config, env=os.environ, env_prefix=ENV_PREFIX, flags=flags
        )
    return config


def run(args: argparse.Namespace, *, open_api: OpenApi | None = None) -> int:
    config = load(args)  # a bad config fails here: exit 2 via the dispatcher
    if args.print_config:
        return print_config(config)

    # Heavy imports only now: ``metagpu --help`` and the other commands never load gRPC.
    import asyncio  # noqa: PLC0415

    from plugin.deviceplugin.supervisor import Supervisor  # noqa: PLC0415

    supervisor = Supervisor(lambda: load(args), config=config, open_api=open_api)
    return asyncio.run(supervisor.run())


def device_plugin_command(*, open_api: OpenApi | None) -> Command:
    """The ``device-plugin`` command; ``open_api`` opens the Kubernetes API for the
    pod watch that honours the scheduler extender's assignments (None: no API)."""

    def run_plugin(args: argparse.Namespace) -> int:
        return run(args, open_api=open_api)

    return Command(
        name="device-plugin",
        help="serve meta-devices to the kubelet (v1beta1)",
        description=DESCRIPTION,
        add_arguments=add_arguments,
        run=run_plugin,
    )


COMMANDS: Final = (device_plugin_command(open_api=None),)
"""Without the Kubernetes API; ``metagpu device-plugin`` (:mod:`metagpu.device_plugin`)
hands in the credentials loader."""
