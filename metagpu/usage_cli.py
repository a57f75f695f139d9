"""``metagpu usage``: GPU-hours per namespace, pod, workload, node or GPU model, and
right-sizing, from Prometheus' HTTP API (``/api/v1/query``).

The queries and the report are :mod:`metagpu.usage`; this module only parses
flags, asks Prometheus (standard library HTTP, one instant query per figure,
all at the window's end) and prints. docs/monitoring.md, "The usage report".
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Final, get_args

from metagpu.usage import (
    GROUP_LABELS,
    KINDS,
    OutputFormat,
    UsageError,
    Window,
    build_recommendations,
    evidence_queries,
    gpu_hours_query,
    merge_gpu_hours,
    parse_duration_s,
    render_recommendations,
    render_usage,
)
from plugin.api.commands import EXIT_FAILURE, EXIT_USAGE, Command

DEFAULT_URL: Final = "http://localhost:9090"


class Prometheus:
    """Instant queries against one Prometheus (or Thanos/Mimir query frontend)."""

    def __init__(
        self, url: str, *, timeout_s: float, bearer_token: str | None, ca_file: Path | None
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"Accept": "application/json"}
        if bearer_token:
            self.headers["Authorization"] = f"Bearer {bearer_token}"
        self.context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None

    def query(self, expr: str, *, at_s: int) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to at ``at_s``."""
        body = urllib.parse.urlencode({"query": expr, "time": str(at_s)}).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/query", data=body, headers=self.headers, method="POST"
        )
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self.context
            ) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                answer = json.loads(exc.read())
            except ValueError:
                raise UsageError(f"Prometheus at {self.url} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UsageError(f"cannot reach Prometheus at {self.url}: {reason}") from exc
        if answer.get("status") != "success":
            raise UsageError(
                f"Prometheus refused a query ({answer.get('errorType')}: {answer.get('error')}): "
                f"{expr}"
            )
        data = answer["data"]
        if data.get("resultType") != "vector":
            raise UsageError(f"expected an instant vector, got {data.get('resultType')}: {expr}")
        return data["result"]  # type: ignore[no-any-return]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus",
        default=DEFAULT_URL,
        metavar="URL",
        help="Prometheus base URL (default %(default)s; e.g. after "
        "`kubectl -n monitoring port-forward svc/prometheus-operated 9090`)",
    )
    parser.add_argument(
        "--window", default="7d", help="how far back to count, e.g. 24h, 7d, 30d (default 7d)"
    )
    parser.add_argument(
        "--step",
        default="1m",
        help="sampling step; the window must be a whole number of steps (default 1m)",
    )
    parser.add_argument(
        "--end",
        type=float,
        default=None,
        metavar="UNIX_TIME",
        help="end of the window (default now), rounded down to the step",
    )
    parser.add_argument(
        "--by",
        choices=tuple(GROUP_LABELS),
        default="namespace",
        help="group GPU-hours by (workload needs kube-state-metrics' kube_pod_owner)",
    )
    parser.add_argument(
        "--rightsize",
        action="store_true",
        help="per container: the share it holds, its peak and p95 memory and SM, "
        "and the share it needs (whole units)",
    )
    parser.add_argument(
        "-o", "--output", choices=get_args(OutputFormat), default="table", help="output format"
    )
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per query (default 60)")
    parser.add_argument(
        "--bearer-token-file", type=Path, default=None, help="send this token as Bearer"
    )
    parser.add_argument(
        "--ca-file", type=Path, default=None, help="CA bundle that signs Prometheus' certificate"
    )


def run(args: argparse.Namespace) -> int:
    try:
        window = Window.ending(
            seconds=parse_duration_s(args.window),
            step_s=parse_duration_s(args.step),
            at_s=time.time() if args.end is None else args.end,
        )
        token = args.bearer_token_file.read_text().strip() if args.bearer_token_file else None
    except (UsageError, OSError) as exc:
        print(f"metagpu usage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    prometheus = Prometheus(
        args.prometheus, timeout_s=args.timeout_s, bearer_token=token, ca_file=args.ca_file
    )
    try:
        if args.rightsize:
            answers = {
                name: prometheus.query(expr, at_s=window.end_s)
                for name, expr in evidence_queries(window).items()
            }
            print(
                render_recommendations(
                    build_recommendations(answers), window_text=args.window, fmt=args.output
                )
            )
            return 0
        results = {
            kind: prometheus.query(
                gpu_hours_query(kind, group_by=args.by, window=window), at_s=window.end_s
            )
            for kind in KINDS
        }
    except UsageError as exc:
        print(f"metagpu usage: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    rows = merge_gpu_hours(args.by, results)
    if not rows and args.by == "workload":
        print(
            "metagpu usage: no series: --by workload joins kube-state-metrics' kube_pod_owner; "
            "is kube-state-metrics scraped?",
            file=sys.stderr,
        )
    print(render_usage(rows, group_by=args.by, window_text=args.window, fmt=args.output))
    return 0


COMMANDS: Final = (
    Command(
        name="usage",
        help="GPU-hours allocated and used per namespace/pod/workload, and right-sizing, "
        "from Prometheus",
        add_arguments=add_arguments,
        run=run,
        description=__doc__,
    ),
)
