"""``metagpu certs generate | bootstrap | inspect``: flags only; the work is in ``commands``.

Light at import time (argparse, the standard library and ``plugin.api``), so
``metagpu certs --help`` never loads cryptography or kubernetes-asyncio.
Every setting flag falls back to a ``METAGPU_CERTS_*`` environment variable
(see :mod:`certs.config`); the flags below default to None so that the
precedence flags > env > defaults is applied in one place.
"""

from __future__ import annotations

import argparse

from certs.permissions import DEFAULT_SECRET_NAME
from plugin.api.commands import Command
from plugin.api.logs import LOG_FORMATS, LOG_LEVELS

KEY_ALGORITHMS = ("ecdsa-p256", "ecdsa-p384", "rsa-2048", "rsa-3072", "rsa-4096")
"""Mirrors :data:`certs.issue.KEY_ALGORITHMS` (kept here to stay light; a test
checks they agree)."""

DESCRIPTION = """\
TLS certificates for the metagpu webhook.

  generate   write ca.crt, ca.key, tls.crt, tls.key into a directory (local runs,
             or files you turn into a Secret yourself); reuses the CA on later runs
  bootstrap  keep a kubernetes.io/tls Secret and the webhook configuration's caBundle
             in a cluster without cert-manager (run as a Helm hook Job or by hand)
  inspect    show a certificate from a file, or the one an https:// endpoint serves

Run `metagpu certs <subcommand> --help` for its flags. Exit codes: 0 success,
1 failure (the message says what and how to fix it), 2 bad flags or settings.
"""


def _env(field: str) -> str:
    return f"METAGPU_CERTS_{field.upper()}"


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    """Accept the shared logging flags after the subcommand too (``bootstrap --log-level``)."""
    parser.add_argument(
        "--log-level", type=str.upper, choices=LOG_LEVELS, default=argparse.SUPPRESS
    )
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS)


def add_issue_flags(parser: argparse.ArgumentParser) -> None:
    """Names, lifetimes and key algorithm: shared by generate and bootstrap."""
    g = parser.add_argument_group("certificate")
    g.add_argument(
        "--dns",
        action="append",
        metavar="NAME",
        help=f"extra DNS name for the serving certificate; repeatable (env {_env('dns')}, "
        "comma-separated)",
    )
    g.add_argument(
        "--ip",
        action="append",
        metavar="IP",
        help=f"extra IP address for the serving certificate; repeatable (env {_env('ip')})",
    )
    g.add_argument(
        "--validity-days",
        type=int,
        metavar="N",
        help=f"serving certificate lifetime (env {_env('validity_days')}; default 365)",
    )
    g.add_argument(
        "--ca-validity-days",
        type=int,
        metavar="N",
        help=f"CA lifetime (env {_env('ca_validity_days')}; default 3650)",
    )
    g.add_argument(
        "--key-algorithm",
        choices=KEY_ALGORITHMS,
        help=f"algorithm of new keys (env {_env('key_algorithm')}; default ecdsa-p256)",
    )
    g.add_argument(
        "--renew-fraction",
        type=float,
        metavar="F",
        help="renew a certificate when less than this fraction of its lifetime is left "
        f"(env {_env('renew_fraction')}; default 0.333)",
    )
    a = parser.add_argument_group("actions")
    a.add_argument(
        "--force",
        action="store_true",
        help="re-issue the serving certificate even if it is not due (the CA is kept)",
    )
    a.add_argument(
        "--new-ca",
        action="store_true",
        help="replace the CA with a new key (and re-issue the serving certificate); "
        "bootstrap keeps the old CA in the caBundle for 10 minutes, and a later run "
        "drops it",
    )
    a.add_argument("--dry-run", action="store_true", help="decide and report, but write nothing")
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="report format"
    )


def add_service_flags(parser: argparse.ArgumentParser, *, service_default: str | None) -> None:
    """The Service whose names the certificate carries."""
    g = parser.add_argument_group("service")
    default = f"default {service_default}" if service_default else "no default"
    g.add_argument(
        "--service",
        metavar="NAME",
        help=f"the webhook's Service; its 4 DNS names become SANs (env {_env('service')}; "
        f"{default})",
    )
    g.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help=f"the Service's namespace (env {_env('namespace')}"
        + (
            "; default: the pod's own namespace in-cluster, else metagpu)"
            if service_default
            else ")"
        ),
    )
    g.add_argument(
        "--cluster-domain",
        metavar="DOMAIN",
        help=f"the cluster DNS domain (env {_env('cluster_domain')}; default cluster.local)",
    )


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    add_logging_flags(parser)
    parser.add_argument(
        "--out",
        metavar="DIR",
        help=f"directory for ca.crt, ca.key, tls.crt, tls.key (env {_env('out')}; required)",
    )
    add_service_flags(parser, service_default=None)
    add_issue_flags(parser)


def add_bootstrap_arguments(parser: argparse.ArgumentParser) -> None:
    add_logging_flags(parser)
    add_service_flags(parser, service_default="metagpu-webhook")
    k = parser.add_argument_group("cluster")
    k.add_argument(
        "--secret",
        metavar="NAME",
        help=f"the kubernetes.io/tls Secret to keep (env {_env('secret')}; "
        f"default {DEFAULT_SECRET_NAME})",
    )
    k.add_argument(
        "--webhook-config",
        metavar="NAME",
        help="MutatingWebhookConfiguration whose caBundle to keep; without it only the Secret "
        f"is ensured (env {_env('webhook_config')})",
    )
    k.add_argument(
        "--webhook",
        dest="webhooks",
        action="append",
        metavar="NAME",
        help="a webhook of that configuration to patch; repeatable; default: all "
        f"(env {_env('webhooks')})",
    )
    k.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (env METAGPU_CERTS_KUBECONFIG; default: in-cluster credentials, "
        "else $KUBECONFIG, else ~/.kube/config)",
    )
    k.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")
    k.add_argument(
        "--request-timeout-s",
        type=float,
        metavar="S",
        help=f"per API request (env {_env('request_timeout_s')}; default 10)",
    )
    k.add_argument(
        "--attempts",
        type=int,
        metavar="N",
        help="tries per object on 409 conflicts and transient errors "
        f"(env {_env('attempts')}; default 5)",
    )
    add_issue_flags(parser)


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    add_logging_flags(parser)
    parser.add_argument(
        "file", nargs="?", metavar="FILE", help="PEM certificate file; - reads stdin"
    )
    parser.add_argument(
        "--url", metavar="https://HOST:PORT", help="inspect what this endpoint serves instead"
    )
    parser.add_argument(
        "--ca",
        metavar="FILE",
        help="CA bundle to verify against (a file's chain, or a verifying handshake with --url)",
    )
    parser.add_argument("--key", metavar="FILE", help="check that this private key is the pair")
    parser.add_argument(
        "--server-name",
        metavar="NAME",
        help="name to check against the SANs, and the SNI sent with --url (default: the URL's "
        "host); use <service>.<namespace>.svc to check as the API server does",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=5.0, metavar="S", help="connect timeout for --url"
    )
    parser.add_argument(
        "--renew-fraction",
        type=float,
        default=1 / 3,
        metavar="F",
        help="fraction of the lifetime left at which renewal is due (default 0.333)",
    )
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="report format"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="certs_command", metavar="SUBCOMMAND", required=True)
    fmt = argparse.RawDescriptionHelpFormatter
    add_generate_arguments(
        sub.add_parser(
            "generate",
            help="write a CA and a serving certificate into a directory",
            description="Write DIR/ca.crt, DIR/ca.key (0600), DIR/tls.crt, DIR/tls.key (0600).\n"
            "An existing usable CA in DIR is reused; the serving certificate is re-issued\n"
            "only when due, when its names change, or with --force. Without any name the\n"
            "certificate is for localhost, 127.0.0.1 and ::1.",
            formatter_class=fmt,
        )
    )
    add_bootstrap_arguments(
        sub.add_parser(
            "bootstrap",
            help="keep the webhook's TLS Secret and caBundle in a cluster without cert-manager",
            description="Create or reuse a kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt,\n"
            "ca.key), keep its CA stable, re-issue the serving certificate only when due,\n"
            "then (with --webhook-config) patch caBundle where it differs. Idempotent: a\n"
            "second run sends no writes. Order: the Secret first, then the caBundle.",
            formatter_class=fmt,
        )
    )
    add_inspect_arguments(
        sub.add_parser(
            "inspect",
            help="show a certificate from a file or from an https:// endpoint",
            description="Subject, issuer, serial, validity, time left, SANs and whether renewal\n"
            "is due, plus checks (--ca, --key, --server-name). Exit 1 when a check fails\n"
            "or the certificate is outside its validity period.",
            formatter_class=fmt,
        )
    )


def run(args: argparse.Namespace) -> int:
    from certs import commands  # noqa: PLC0415 - heavy; keep `metagpu certs --help` light

    handlers = {
        "generate": commands.run_generate,
        "bootstrap": commands.run_bootstrap_command,
        "inspect": commands.run_inspect,
    }
    return handlers[args.certs_command](args)


COMMANDS: tuple[Command, ...] = (
    Command(
        name="certs",
        help="generate, bootstrap and inspect the webhook's TLS certificates",
        add_arguments=add_arguments,
        run=run,
        description=DESCRIPTION,
    ),
)
