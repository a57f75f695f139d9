"""``metagpu cleanup``: remove what metagpu wrote into the cluster, as a Helm uninstall hook.

Light at import time (argparse and ``plugin.api``), so ``--help`` never loads
kubernetes-asyncio. What it removes and why is in :mod:`metagpu.cleanup.plan`
and docs/install.md "Uninstall"; the permissions in
:mod:`metagpu.cleanup.permissions`.

It exits 0 when something could not be removed (each failure is logged with
the command that does it by hand), unless ``--strict``: a failing uninstall
hook stops ``helm uninstall`` halfway, and leftover labels are a nuisance, not
a reason to block an operator who is removing metagpu.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Final

from plugin.api.commands import EXIT_FAILURE, EXIT_OK, Command
from plugin.api.settings import ConfigError

if TYPE_CHECKING:
    from metagpu.cleanup.plan import Report

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S: Final = 60.0
"""The whole run. Well inside the chart's activeDeadlineSeconds (120 s) and helm's
default 5 min, so a slow API server ends in a report, not a killed pod."""
DEFAULT_REQUEST_TIMEOUT_S: Final = 10.0
"""Per request: these are small reads and writes; ten seconds rides out a leader election."""
DEFAULT_NAMESPACE: Final = "metagpu"

DESCRIPTION = """\
Remove what metagpu's components wrote into the cluster and Helm does not own:

  * from every Node, the labels and annotations the node agent writes
    (metagpu.io/gpu-product, ..., metagpu.io/gpu-ledger), and no other key;
  * the release's Leases named with --lease (leader elections), in --namespace;
  * with --dra, the ResourceClaimTemplates labelled
    app.kubernetes.io/managed-by=metagpu that no pod names any more (one a pod
    still names is kept, and the report says so);
  * with --quota-companions, the quota mirror's companion ResourceQuotas
    (app.kubernetes.io/managed-by=metagpu-quota-mirror), never a quota of yours.

The chart runs it as a post-delete hook (cleanup.enabled). It is idempotent.
Every failure is logged with the command that does it by hand; the exit code
is 0 all the same unless --strict.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``metagpu cleanup``."""
    parser.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help=f"namespace of the Leases (default: the pod's own, else {DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "--lease",
        action="append",
        default=[],
        metavar="NAME",
        help="a Lease of the release to delete; repeatable",
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="also delete the unused ResourceClaimTemplates of the webhook's DRA mode",
    )
    parser.add_argument(
        "--quota-companions",
        action="store_true",
        help="also delete the quota mirror's companion ResourceQuotas",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="deadline of the whole run (default %(default)g)",
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        metavar="S",
        help="deadline of each API request (default %(default)g)",
    )
    parser.add_argument(
        "--page-size",
        type=int,
        default=500,
        metavar="N",
        help="objects per list request (default %(default)d)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when anything could not be removed (default: report it, exit 0)",
    )
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: in-cluster)")
    parser.add_argument("--context", help="kubeconfig context")


def run(args: argparse.Namespace) -> int:
    """Clean up, print the report; 0 unless ``--strict`` and something failed."""
    for flag, value in (
        ("--timeout-s", args.timeout_s),
        ("--request-timeout-s", args.request_timeout_s),
    ):
        if not value > 0:
            raise ConfigError(f"{flag} must be more than 0: {value}")
    if args.page_size < 1:
        raise ConfigError(f"--page-size must be at least 1: {args.page_size}")
    report = asyncio.run(clean(args))
    print(report.summary())
    return EXIT_FAILURE if report.failed and args.strict else EXIT_OK


async def clean(args: argparse.Namespace) -> Report:
    """Open the API client and run :func:`metagpu.cleanup.kube.run_cleanup`."""
    # kubernetes-asyncio only here: --help never loads it.
    from certs.kube import KubeCredentialsError, default_namespace, open_api_client  # noqa: PLC0415
    from metagpu.cleanup.kube import CleanupTarget, run_cleanup  # noqa: PLC0415
    from metagpu.cleanup.plan import Report  # noqa: PLC0415

    target = CleanupTarget(
        namespace=args.namespace or default_namespace(DEFAULT_NAMESPACE),
        leases=tuple(dict.fromkeys(args.lease)),
        dra=args.dra,
        quota_companions=args.quota_companions,
    )
    try:
        async with open_api_client(kubeconfig=args.kubeconfig, context=args.context) as (
            api_client,
            source,
        ):
            logger.info(
                "cleanup starting",
                extra={
                    "credentials": source,
                    "namespace": target.namespace,
                    "leases": list(target.leases),
                    "dra": target.dra,
                },
            )
            return await run_cleanup(
                api_client,
                target,
                timeout_s=args.timeout_s,
                request_timeout_s=args.request_timeout_s,
                page_size=args.page_size,
            )
    except KubeCredentialsError as exc:
        logger.warning("cleanup: %s; nothing was removed", exc)
        return Report(failed=[f"{exc}; by hand: see docs/install.md, Uninstall"])


COMMANDS: Final = (
    Command(
        name="cleanup",
        help="remove metagpu's node labels, Leases and claim templates (uninstall hook)",
        add_arguments=add_arguments,
        run=run,
        description=DESCRIPTION,
    ),
)
