"""``metagpu webhook`` and ``metagpu mutate``: flags, config loading, and the entry points.

Light at import time (argparse, the standard library and ``plugin.api``): the
dispatcher imports this module to build ``--help``; aiohttp, the Kubernetes
client and the rules are imported inside each command's ``run``. Neither
command ever loads gRPC or NVML (an import-linter contract checks it).

Precedence is flags > env (``METAGPU_WEBHOOK_*``) > ``--config`` file >
defaults; a flag that is not given does not override anything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from plugin.api.commands import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    Command,
    add_config_file_argument,
    add_print_config_argument,
    print_config,
)
from plugin.api.resources import COMPUTE_POLICIES

if TYPE_CHECKING:
    from webhook.config import WebhookConfig
    from webhook.server import RunningWebhook

ENV_CONFIG_FILE: Final = "METAGPU_WEBHOOK_CONFIG"
"""Config file path when ``--config`` is not given."""

EXAMPLE_REVIEW: Final = Path("examples/admission-review-half-gpu.json")

_DECODE_PATCH: Final = (
    "import base64,json,sys; r=json.load(sys.stdin)['response']; "
    "print(json.dumps({k: v for k, v in r.items() if k != 'patch'}, indent=2)); "
    "print(json.dumps(json.loads(base64.b64decode(r.get('patch', 'W10='))), indent=2))"
)


def curl_command(mutate_url: str, ca_file: Path, example: Path = EXAMPLE_REVIEW) -> str:
    """A shell line that posts ``example`` to the webhook and prints the decoded patch."""
    return (
        f"curl -sS --cacert {shlex.quote(str(ca_file))} -H 'Content-Type: application/json' "
        f"--data @{shlex.quote(str(example))} {shlex.quote(mutate_url)} "
        f"| python3 -c {shlex.quote(_DECODE_PATCH)}"
    )


# ------------------------------------------------------------------ webhook
CONNECTION_FLAGS: Final[tuple[tuple[str, type, str], ...]] = (
    ("max-connections", int, "open connections in all (1024)"),
    ("max-connections-per-client", int, "open connections from one address (256)"),
    ("tls-handshake-timeout", float, "seconds a TLS handshake may take (10)"),
    ("header-timeout", float, "seconds for a request's headers (10)"),
    ("body-timeout", float, "seconds for a request's body after its headers (30)"),
    ("write-timeout", float, "seconds a client may take to read its answer (30)"),
    ("idle-timeout", float, "seconds an idle keep-alive connection stays open (120)"),
)
"""``--FLAG`` for each ``connections.*`` setting (``--header-timeout`` sets
``connections.header_timeout_s``)."""


def _connection_setting(flag: str) -> str:
    name = flag.replace("-", "_")
    return f"connections.{name}" + ("_s" if name.endswith("timeout") else "")


def _webhook_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_file_argument(
        parser, env_var=ENV_CONFIG_FILE, what="YAML config file; see docs/webhook.md"
    )
    add_print_config_argument(parser)
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="address to serve HTTPS on (default 127.0.0.1:8443)"
    )
    tls = parser.add_argument_group("TLS")
    tls.add_argument("--tls-cert", type=Path, metavar="FILE", help="serving certificate (PEM)")
    tls.add_argument("--tls-key", type=Path, metavar="FILE", help="its private key (PEM)")
    tls.add_argument(
        "--tls-dir",
        type=Path,
        metavar="DIR",
        help="without --tls-cert/--tls-key: where the generated local CA and certificate go "
        "(default run/webhook-tls)",
    )
    rules = parser.add_argument_group("rules")
    rules.add_argument(
        "--resource-name", help="metagpu resource fractions become (cnvrg.io/metagpu)"
    )
    rules.add_argument(
        "--units-per-gpu", type=int, help="units per GPU; must match the plugin (100)"
    )
    rules.add_argument(
        "--default-compute-policy",
        choices=COMPUTE_POLICIES,
        help="policy when none is set (balance)",
    )
    conns = parser.add_argument_group(
        "connections", "what one client may hold, and how long each stage may take"
    )
    for flag, kind, what in CONNECTION_FLAGS:
        conns.add_argument(
            f"--{flag}", type=kind, metavar="N" if kind is int else "SECONDS", help=what
        )
    kube = parser.add_argument_group("Kubernetes")
    kube.add_argument(
        "--kubernetes",
        choices=("auto", "true", "false"),
        help="read namespace annotations from the API: auto (in a cluster or with a "
        "kubeconfig), true (required), false (config alone)",
    )
    kube.add_argument("--kubeconfig", type=Path, metavar="FILE", help="kubeconfig to use")
    kube.add_argument(
        "--quota-mirror",
        choices=("auto", "true", "false"),
        help="keep a companion ResourceQuota in units for every GPU quota (docs/quotas.md): "
        "auto (in a cluster), true, false",
    )


def _lease_arguments(parser: argparse.ArgumentParser) -> None:
    lease = parser.add_argument_group("leader election (quota mirror)")
    lease.add_argument("--lease-name", help="Lease to elect a leader with (metagpu-quota-mirror)")
    lease.add_argument(
        "--lease-namespace", help="namespace of the Lease (default: the pod's own namespace)"
    )
    lease.add_argument("--identity", help="this replica's name in the Lease (<hostname>_<uuid>)")


def _tri_state(value: str | None) -> str | bool | None:
    return value if value in (None, "auto") else value == "true"


def load_webhook_config(args: argparse.Namespace) -> WebhookConfig:
    """The config from ``--config``, ``METAGPU_WEBHOOK_*`` and the flags given."""
    from plugin.api.settings import load_config  # noqa: PLC0415 - pydantic, yaml: not for --help
    from webhook.config import ENV_PREFIX, WebhookConfig  # noqa: PLC0415 - same

    flags: dict[str, Any] = {
        "listen": getattr(args, "listen", None),
        "tls.cert_file": getattr(args, "tls_cert", None),
        "tls.key_file": getattr(args, "tls_key", None),
        "tls.generate_dir": getattr(args, "tls_dir", None),
        "resource_name": getattr(args, "resource_name", None),
        "units_per_gpu": getattr(args, "units_per_gpu", None),
        "default_compute_policy": getattr(args, "default_compute_policy", None),
        "kubernetes.kubeconfig": getattr(args, "kubeconfig", None),
        "kubernetes.enabled": _tri_state(getattr(args, "kubernetes", None)),
        "quota_mirror.enabled": _tri_state(getattr(args, "quota_mirror", None)),
        "quota_mirror.lease_name": getattr(args, "lease_name", None),
        "quota_mirror.lease_namespace": getattr(args, "lease_namespace", None),
        "quota_mirror.identity": getattr(args, "identity", None),
    }
    for flag, _, _ in CONNECTION_FLAGS:
        flags[_connection_setting(flag)] = getattr(args, flag.replace("-", "_"), None)
    return load_config(
        WebhookConfig, file=args.config, env=os.environ, env_prefix=ENV_PREFIX, flags=flags
    )


def listen_line(host: str, port: int, mutate_url: str) -> str:
    """The start-up line: where the webhook really listens, and a URL to try.

    A wildcard listen address (the chart's ``0.0.0.0``, or ``::``) is said as
    such: a pod that logged only its loopback URL sent operators looking for
    why the Service could not reach a webhook "bound to 127.0.0.1"."""
    if host in ("", "0.0.0.0"):
        where = f"every IPv4 address (0.0.0.0:{port})"
    elif host == "::":
        where = f"every address ([::]:{port}, IPv6 and, where the kernel maps them, IPv4)"
    else:
        return f"metagpu webhook: serving {mutate_url}"
    return f"metagpu webhook: listening on {where}; from this host: serving {mutate_url}"


def _announce(hook: RunningWebhook) -> None:
    print(listen_line(hook.host, hook.port, hook.mutate_url), flush=True)
    if hook.ca_file is not None:
        print(f"metagpu webhook: generated CA (trust it to connect): {hook.ca_file}", flush=True)
        example = EXAMPLE_REVIEW if EXAMPLE_REVIEW.exists() else Path("REVIEW.json")
        print("try:\n  " + curl_command(hook.mutate_url, hook.ca_file, example), flush=True)


def run_webhook(args: argparse.Namespace) -> int:
    config = load_webhook_config(args)
    if args.print_config:
        return print_config(config)
    from webhook.namespaces import KubernetesUnavailableError  # noqa: PLC0415 - heavy
    from webhook.quotas.service import QuotaMirrorConfigError  # noqa: PLC0415 - heavy
    from webhook.server import serve  # noqa: PLC0415 - heavy: aiohttp, kubernetes_asyncio

    try:
        return asyncio.run(serve(config, announce=_announce))
    except (KubernetesUnavailableError, QuotaMirrorConfigError) as exc:
        print(f"metagpu webhook: {exc}", file=sys.stderr)
        return EXIT_USAGE


# ------------------------------------------------------------- quota mirror
def _quota_mirror_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_file_argument(
        parser,
        env_var=ENV_CONFIG_FILE,
        what="the webhook's config file (resource_name, units_per_gpu, quota_mirror.*)",
    )
    add_print_config_argument(parser)
    rules = parser.add_argument_group("units")
    rules.add_argument("--resource-name", help="metagpu resource to limit (cnvrg.io/metagpu)")
    rules.add_argument("--units-per-gpu", type=int, help="units per GPU (100)")
    kube = parser.add_argument_group("Kubernetes")
    kube.add_argument("--kubeconfig", type=Path, metavar="FILE", help="kubeconfig to use")
    _lease_arguments(parser)


def run_quota_mirror(args: argparse.Namespace) -> int:
    config = load_webhook_config(args)
    if config.quota_mirror.enabled is False:
        print(
            "metagpu quota-mirror: quota_mirror.enabled is false in the configuration; this "
            "command runs the mirror, so drop that setting (or run the webhook instead)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.print_config:
        return print_config(config)
    from webhook.namespaces import KubernetesUnavailableError  # noqa: PLC0415 - heavy
    from webhook.quotas.service import (  # noqa: PLC0415 - heavy: kubernetes_asyncio
        QuotaMirrorConfigError,
        serve_quota_mirror,
    )

    try:
        return asyncio.run(serve_quota_mirror(config))
    except (KubernetesUnavailableError, QuotaMirrorConfigError) as exc:
        print(f"metagpu quota-mirror: {exc}", file=sys.stderr)
        return EXIT_USAGE


# ------------------------------------------------------------------- mutate
def _mutate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="Pod, workload, List or AdmissionReview, YAML or JSON; '-' for stdin; repeatable",
    )
    add_config_file_argument(
        parser, env_var=ENV_CONFIG_FILE, what="the webhook's config file, to apply its rules"
    )
    parser.add_argument(
        "--namespace-policy",
        choices=COMPUTE_POLICIES,
        help="simulate the namespace's metagpu.io/compute-policy annotation",
    )
    parser.add_argument(
        "--namespace-opt-out",
        action="store_true",
        help='simulate metagpu.io/inject: "false" on the namespace',
    )
    parser.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="output format (yaml)"
    )


def run_mutate(args: argparse.Namespace) -> int:
    config = load_webhook_config(args)
    from webhook.model import NamespaceFacts, RuleSettings  # noqa: PLC0415 - the rules
    from webhook.offline import (  # noqa: PLC0415 - the rules, jsonpatch
        InputError,
        Result,
        mutate_document,
        read_documents,
        render,
    )

    settings = RuleSettings.from_config(config)
    namespace = NamespaceFacts(
        compute_policy=args.namespace_policy,
        inject="false" if args.namespace_opt_out else None,
    )
    results: list[Result] = []
    failed = False
    for name in args.filename:
        try:
            if name == "-":
                docs = list(read_documents(sys.stdin, name="<stdin>"))
            else:
                with open(name, encoding="utf-8") as fh:
                    docs = list(read_documents(fh, name=name))
        except (OSError, UnicodeDecodeError) as exc:
            print(f"error: {name}: cannot read: {exc}", file=sys.stderr)
            failed = True
            continue
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
            continue
        for source, doc in docs:
            results.append(
                mutate_document(doc, source=source, settings=settings, namespace=namespace)
            )
    for r in results:
        for warning in r.warnings:
            print(f"Warning: {r.source}: {warning}", file=sys.stderr)
        if not r.allowed:
            print(f"error: {r.message}", file=sys.stderr)
            failed = True
        elif r.message:
            print(f"note: {r.message}", file=sys.stderr)
    sys.stdout.write(render(results, output=args.output))
    return EXIT_FAILURE if failed else EXIT_OK


COMMANDS: Final = (
    Command(
        name="webhook",
        help="serve the mutating admission webhook over HTTPS",
        add_arguments=_webhook_arguments,
        run=run_webhook,
        description=(
            "Serve AdmissionReview v1 on POST /mutate over HTTPS, with /healthz, /readyz and\n"
            "/metrics. Without --tls-cert/--tls-key it generates a local CA and a certificate\n"
            "for localhost (the embedded default) and prints where the CA is.\n\n"
            "Configuration: flags > METAGPU_WEBHOOK_* env vars > --config file > defaults."
        ),
    ),
    Command(
        name="quota-mirror",
        help="keep a ResourceQuota in metagpu units beside every GPU quota (leader-elected)",
        add_arguments=_quota_mirror_arguments,
        run=run_quota_mirror,
        description=(
            "For every ResourceQuota that limits nvidia.com/gpu, keep a companion quota in the\n"
            "same namespace limiting the metagpu resource in units (GPUs x units_per_gpu),\n"
            "owned by the source. Replicas elect a leader on a coordination.k8s.io Lease; only\n"
            "the leader writes. The webhook runs the same mirror in a cluster unless\n"
            "quota_mirror.enabled is false; this command runs it on its own.\n"
            "See docs/quotas.md.\n\n"
            "Configuration: flags > METAGPU_WEBHOOK_* env vars > --config file > defaults."
        ),
    ),
    Command(
        name="mutate",
        help="apply the webhook's rules to a pod file offline and show the result",
        add_arguments=_mutate_arguments,
        run=run_mutate,
        description=(
            "Apply the webhook's rules to Pods, workloads (Deployment, Job, ...) or\n"
            "AdmissionReviews from files, without a cluster, and print the resulting objects\n"
            "with their patch. Warnings go to stderr; a denial prints its message and exits 1.\n\n"
            "  metagpu mutate -f pod.yaml\n"
            "  metagpu mutate -f deployment.yaml -o json\n"
            "  metagpu mutate -f pod.yaml | kubectl apply -f -"
        ),
    ),
)
