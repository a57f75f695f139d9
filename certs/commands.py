"""The bodies of ``metagpu certs generate | bootstrap | inspect`` (imported only when run).

Each turns flags into settings (:mod:`certs.config`, flags > env > defaults),
calls the library, prints a report on stdout and returns an exit code.
Domain errors become one ``metagpu certs <sub>: error: ...`` line on stderr
and exit 1; bad settings raise :class:`plugin.api.settings.ConfigError`,
which the dispatcher turns into exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from certs.bootstrap import CA_CERT_KEY, TLS_CERT_KEY, BootstrapError
from certs.config import (
    DEFAULT_NAMESPACE,
    ENV_PREFIX,
    BootstrapSettings,
    GenerateSettings,
)
from certs.files import ensure_bundle_dir, read_bundle_dir
from certs.inspection import (
    InspectError,
    inspect_pem,
    inspect_url,
    read_source,
    to_json,
    to_text,
)
from certs.issue import CertError, inspect_cert, utc_now
from certs.permissions import permissions_for
from certs.reconcile import (
    BootstrapResult,
    BootstrapTarget,
    RetryPolicy,
    cert_json,
    run_bootstrap,
)
from plugin.api.commands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from plugin.api.settings import ConfigError, load_config

logger = logging.getLogger(__name__)


def _fail(sub: str, message: object) -> int:
    print(f"metagpu certs {sub}: error: {message}", file=sys.stderr)
    return EXIT_FAILURE


def _issue_flags(args: argparse.Namespace) -> dict[str, object]:
    return {
        "dns": args.dns,
        "ip": args.ip,
        "validity_days": args.validity_days,
        "ca_validity_days": args.ca_validity_days,
        "key_algorithm": args.key_algorithm,
        "renew_fraction": args.renew_fraction,
    }


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


# ----------------------------------------------------------------- generate
def run_generate(args: argparse.Namespace) -> int:
    settings = load_config(
        GenerateSettings,
        env=os.environ,
        env_prefix=ENV_PREFIX,
        flags={
            **_issue_flags(args),
            "out": args.out,
            "service": args.service,
            "namespace": args.namespace,
            "cluster_domain": args.cluster_domain,
        },
    )
    try:
        policy = settings.policy(*settings.names())
        result = ensure_bundle_dir(
            settings.out,
            policy=policy,
            now=utc_now(),
            force_leaf=args.force,
            new_ca=args.new_ca,
            dry_run=args.dry_run,
        )
    except (BootstrapError, CertError) as exc:
        return _fail("generate", exc)
    decision = result.decision
    if args.output == "json":
        data = read_bundle_dir(settings.out)
        _print_json(
            {
                "dryRun": args.dry_run,
                "directory": str(settings.out),
                "caAction": decision.ca,
                "caReasons": list(decision.ca_reasons),
                "leafAction": decision.leaf,
                "leafReasons": list(decision.leaf_reasons),
                "notes": list(decision.notes),
                "written": [str(p) for p in result.written],
                "ca": cert_json(inspect_cert(data[CA_CERT_KEY])) if CA_CERT_KEY in data else None,
                "leaf": cert_json(inspect_cert(data[TLS_CERT_KEY]))
                if TLS_CERT_KEY in data
                else None,
            }
        )
        return EXIT_OK
    prefix = "would write" if args.dry_run and decision.changes else "wrote"
    print(f"{settings.out}: {decision.summary()}")
    for note in decision.notes:
        print(f"  note: {note}")
    for path in result.written:
        print(f"  {prefix} {path}")
    if not args.dry_run and decision.changes:
        paths = result.paths
        print(
            f"  serve with: --tls-cert {paths.cert_file} --tls-key {paths.key_file}; "
            f"clients trust {paths.ca_file}"
        )
    return EXIT_OK


# ---------------------------------------------------------------- bootstrap
def bootstrap_settings(args: argparse.Namespace) -> BootstrapSettings:
    """Flags > env > defaults; the namespace falls back to the pod's own."""
    return load_config(
        BootstrapSettings,
        env=os.environ,
        env_prefix=ENV_PREFIX,
        flags={
            **_issue_flags(args),
            "service": args.service,
            "namespace": args.namespace,
            "cluster_domain": args.cluster_domain,
            "secret": args.secret,
            "webhook_config": args.webhook_config,
            "webhooks": args.webhooks,
            "kubeconfig": args.kubeconfig,
            "context": args.context,
            "request_timeout_s": args.request_timeout_s,
            "attempts": args.attempts,
        },
    )


def run_bootstrap_command(args: argparse.Namespace) -> int:
    settings = bootstrap_settings(args)
    try:
        result = asyncio.run(bootstrap(settings, args))
    except (BootstrapError, CertError) as exc:
        return _fail("bootstrap", exc)
    if args.output == "json":
        _print_json(result.to_json())
    else:
        print(result.summary())
    return EXIT_OK


async def bootstrap(settings: BootstrapSettings, args: argparse.Namespace) -> BootstrapResult:
    """Open the API client and run :func:`certs.reconcile.run_bootstrap`."""
    # kubernetes-asyncio only here: generate and inspect never load it.
    from certs.kube import (  # noqa: PLC0415
        KubeClusterApi,
        default_namespace,
        open_api_client,
    )

    namespace = settings.namespace or default_namespace(DEFAULT_NAMESPACE)
    target = BootstrapTarget(
        namespace=namespace,
        secret=settings.secret,
        webhook_config=settings.webhook_config,
        webhooks=settings.webhooks,
    )
    policy = settings.policy(settings.names(namespace), ())
    async with open_api_client(kubeconfig=settings.kubeconfig, context=settings.context) as (
        api_client,
        source,
    ):
        logger.info(
            "bootstrap starting",
            extra={
                "credentials": source,
                "namespace": namespace,
                "secret": settings.secret,
                "webhook_config": settings.webhook_config or "-",
                "dry_run": args.dry_run,
            },
        )
        api = KubeClusterApi(
            api_client,
            request_timeout_s=settings.request_timeout_s,
            permissions=permissions_for(
                secret=settings.secret, webhook_config=settings.webhook_config
            ),
        )
        return await run_bootstrap(
            api,
            target,
            policy=policy,
            clock=utc_now,
            force_leaf=args.force,
            new_ca=args.new_ca,
            dry_run=args.dry_run,
            retry=RetryPolicy(attempts=settings.attempts),
        )


# ------------------------------------------------------------------ inspect
def run_inspect(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.url is None):
        print(
            "metagpu certs inspect: give a certificate FILE (or - for stdin) or --url, not both",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not 0 < args.renew_fraction < 1:
        raise ConfigError(f"--renew-fraction must be between 0 and 1: {args.renew_fraction}")
    now = utc_now()
    try:
        if args.url is not None:
            if args.key is not None:
                print("metagpu certs inspect: --key applies to a FILE only", file=sys.stderr)
                return EXIT_USAGE
            ins = inspect_url(
                args.url,
                now=now,
                ca_file=Path(args.ca) if args.ca else None,
                server_name=args.server_name,
                timeout_s=args.timeout_s,
            )
        else:
            ins = inspect_pem(
                read_source(args.file),
                source="stdin" if args.file == "-" else args.file,
                now=now,
                ca_pem=read_source(args.ca) if args.ca else None,
                key_pem=read_source(args.key) if args.key else None,
                server_name=args.server_name,
            )
    except InspectError as exc:
        return _fail("inspect", exc)
    if args.output == "json":
        _print_json(to_json(ins, now=now, fraction=args.renew_fraction))
    else:
        print(to_text(ins, now=now, fraction=args.renew_fraction))
    return EXIT_OK if ins.ok else EXIT_FAILURE
