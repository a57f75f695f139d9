"""``metagpu scheduler-extender``: flags and entry point (light: argparse and plugin.api at import).

Precedence: **flags > env (``METAGPU_EXTENDER_*``) > ``--config`` file > defaults**.
aiohttp and kubernetes-asyncio are imported inside :func:`run`. The command is
built by :func:`extender_command`, given how to open the Kubernetes API: the
umbrella ``metagpu`` (:mod:`metagpu.scheduler_extender`) hands it
:func:`certs.kube.open_api_client`, which a module of plugin may not import.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

from plugin.api.commands import (
    Command,
    add_config_file_argument,
    add_print_config_argument,
    print_config,
    serve_until_signal,
)
from plugin.api.settings import load_config
from plugin.extender.opener import ApiOpener

if TYPE_CHECKING:
    from plugin.extender.config import ExtenderConfig

CONFIG_FILE_ENV: Final = "METAGPU_EXTENDER_CONFIG"

DESCRIPTION: Final = """\
The metagpu scheduler extender: GPU-aware filter, prioritize and bind for kube-scheduler.

kube-scheduler (profile metagpu-scheduler) calls it for every pod that asks for
cnvrg.io/metagpu. A node passes only if every container's fraction fits on ONE
healthy GPU the way the device plugin places it; bind records the chosen GPUs on
the pod (metagpu.io/assigned-gpus) together with the Binding. It reads each
node's GPU ledger (metagpu.io/gpu-ledger, written by the node agent) through a
watch. Run it as a sidecar of kube-scheduler on localhost (the Helm chart does).

Precedence: flags > env (METAGPU_EXTENDER_*) > --config file > defaults.
See docs/scheduler.md for every setting."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_file_argument(parser, env_var=CONFIG_FILE_ENV)
    parser.add_argument("--listen", metavar="HOST:PORT", help="default 127.0.0.1:8450")
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="also serve /metrics, /healthz and /readyz (no verbs) here, e.g. 0.0.0.0:8451",
    )
    parser.add_argument("--tls-cert-file", type=Path, metavar="FILE", help="serve HTTPS")
    parser.add_argument("--tls-key-file", type=Path, metavar="FILE")
    parser.add_argument("--resource-name", metavar="NAME", help="default cnvrg.io/metagpu")
    parser.add_argument("--placement-policy", choices=("binpack", "spread"), help="default binpack")
    parser.add_argument("--assume-timeout", type=float, metavar="SECONDS", help="default 300")
    parser.add_argument("--kubeconfig", type=Path, metavar="FILE")
    add_print_config_argument(parser)


def load(args: argparse.Namespace) -> ExtenderConfig:
    from plugin.extender.config import ENV_PREFIX, ExtenderConfig  # noqa: PLC0415 - pydantic

    flags = {
        "listen": args.listen,
        "metrics_listen": args.metrics_listen,
        "tls.cert_file": args.tls_cert_file,
        "tls.key_file": args.tls_key_file,
        "resource_name": args.resource_name,
        "placement_policy": args.placement_policy,
        "assume_timeout_s": args.assume_timeout,
        "kubeconfig": args.kubeconfig,
    }
    return load_config(
        ExtenderConfig, file=args.config, env=os.environ, env_prefix=ENV_PREFIX, flags=flags
    )


def run(args: argparse.Namespace, *, open_api: ApiOpener) -> int:
    config = load(args)
    if args.print_config:
        return print_config(config)
    from plugin.extender.runtime import serve  # noqa: PLC0415 - aiohttp, kubernetes-asyncio

    return serve_until_signal(lambda stop: serve(config, open_api=open_api, stop=stop))


def extender_command(*, open_api: ApiOpener) -> Command:
    def run_extender(args: argparse.Namespace) -> int:
        return run(args, open_api=open_api)

    return Command(
        name="scheduler-extender",
        help="GPU-aware kube-scheduler extender: one GPU per fraction",
        description=DESCRIPTION,
        add_arguments=add_arguments,
        run=run_extender,
    )
