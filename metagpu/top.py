"""``metagpu top``: a live picture of one node's GPUs, refreshing like ``top``.

One block per GPU: a bar each for units allocated, memory used and SM used,
then a row per container holding a share of it (its share, memory used
against its limit, SM). It reads the node agent's ``GET /v1/devices`` over
the agent's socket, as ``mgctl get devices`` does on the node (node scope: run
it on the node, or ``kubectl exec`` into the agent pod).

:func:`render_screen` is pure (a document and a width in, lines out); the
loop draws it on the alternate screen every ``--interval`` seconds and quits
on ``q`` (or Ctrl-C). ``--once`` prints one frame and exits, for scripts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import sys
import termios
import time
import tty
from collections.abc import Iterator, Sequence
from typing import Any, Final, TextIO

from plugin.agent.mgctl import AgentClient, MgctlError, socket_path
from plugin.api.commands import EXIT_FAILURE, Command

Json = dict[str, Any]

ENTER_SCREEN: Final = "\x1b[?1049h\x1b[?25l"
"""Alternate screen, cursor hidden (as top does)."""
LEAVE_SCREEN: Final = "\x1b[?25h\x1b[?1049l"
CLEAR: Final = "\x1b[H\x1b[2J"
BAR_MIN: Final = 10
BAR_MAX: Final = 50


def bar(fraction: float | None, width: int, *, ascii_only: bool = False) -> str:
    """``[████░░░░]``: ``fraction`` (0-1, clamped) of ``width`` cells; ``[?…]`` when unknown."""
    full, empty = ("#", ".") if ascii_only else ("█", "░")
    if fraction is None:
        return "[" + "?" * width + "]"
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + full * filled + empty * (width - filled) + "]"


def _ratio(part: Any, whole: Any) -> float | None:
    if part is None or not whole:
        return None
    return float(part) / float(whole)


def _mib(value: Any) -> str:
    return "-" if value is None else f"{int(value)}"


def render_screen(doc: Json, *, width: int, ascii_only: bool = False) -> list[str]:
    """The lines of one frame for a node-scope ``DeviceList`` document."""
    width = max(width, 40)
    bar_width = max(BAR_MIN, min(BAR_MAX, width - 36))
    node = doc.get("node") or "?"
    stale = doc.get("stale") or []
    lines = [
        f"metagpu top  node {node}  taken {doc.get('takenAt', '?')}"
        + (f"  STALE: {', '.join(stale)}" if stale else "")
        + "  (q quits)",
        "",
    ]
    items = doc.get("items") or []
    if not items:
        lines.append("no GPUs on this node")
    for gpu in items:
        health = "healthy" if gpu.get("healthy") else f"UNHEALTHY: {gpu.get('problem') or ''}"
        lines.append(f"GPU {gpu.get('index')}  {gpu.get('name')}  {health}".rstrip())
        total, allocated = gpu.get("unitsTotal") or 0, gpu.get("unitsAllocated") or 0
        used, mem_total = gpu.get("memoryUsedMiB"), gpu.get("memoryTotalMiB")
        util = gpu.get("utilizationPercent")
        rows = [
            ("units", _ratio(allocated, total), f"{allocated}/{total}"),
            ("memory", _ratio(used, mem_total), f"{_mib(used)}/{_mib(mem_total)} MiB"),
            ("SM", None if util is None else util / 100, "-" if util is None else f"{util}%"),
        ]
        lines += [
            f"  {name:<7}{bar(frac, bar_width, ascii_only=ascii_only)}  {text}"
            for name, frac, text in rows
        ]
        other = gpu.get("otherOwner")
        if other:
            lines.append(f"  also served by {', '.join(other.get('resources') or [])}")
        shares = gpu.get("shares") or []
        if shares:
            who = [f"{s.get('namespace')}/{s.get('pod')}/{s.get('container')}" for s in shares]
            name_width = max(len("CONTAINER"), *map(len, who))
            lines.append(f"  {'CONTAINER':<{name_width}}  SHARE   MEMORY USED/LIMIT MiB   SM")
            for name, s in zip(who, shares, strict=True):
                limit = s.get("memoryLimitMiB")
                memory = f"{_mib(s.get('memoryUsedMiB'))}/{_mib(limit)}"
                if s.get("overLimit"):
                    memory += " OVER"
                sm = s.get("utilizationPercent")
                lines.append(
                    f"  {name:<{name_width}}  {s.get('sharePercent', 0):>5g}%  "
                    f"{memory:<22}  {'-' if sm is None else f'{sm}%'}"
                )
        lines.append("")
    return [line[:width] for line in lines]


@contextlib.contextmanager
def _screen(out: TextIO, keys: int | None) -> Iterator[None]:
    """Alternate screen on ``out``; ``keys`` (a terminal) in cbreak mode; both restored."""
    saved = termios.tcgetattr(keys) if keys is not None else None
    if keys is not None:
        tty.setcbreak(keys)
    out.write(ENTER_SCREEN)
    out.flush()
    try:
        yield
    finally:
        out.write(LEAVE_SCREEN)
        out.flush()
        if keys is not None and saved is not None:
            termios.tcsetattr(keys, termios.TCSADRAIN, saved)


def _frame(client: AgentClient, width: int, ascii_only: bool) -> list[str]:
    try:
        return render_screen(client.get("/devices"), width=width, ascii_only=ascii_only)
    except MgctlError as exc:
        return ["metagpu top: " + line for line in str(exc).splitlines()] + ["(retrying)"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket",
        default=None,
        help="the agent's socket (default $METAGPU_AGENT_SOCKET or /var/run/metagpu/agent.sock)",
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between refreshes (default 2)"
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--timeout", type=float, default=5.0, help="per request (default 5 s)")


def run(args: argparse.Namespace) -> int:
    client = AgentClient(socket_path(args.socket), timeout_s=args.timeout)
    out = sys.stdout
    ascii_only = (out.encoding or "").lower().replace("-", "") != "utf8"
    if args.once:
        try:
            doc = client.get("/devices")
        except MgctlError as exc:
            print(f"metagpu top: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        width = shutil.get_terminal_size().columns
        print("\n".join(render_screen(doc, width=width, ascii_only=ascii_only)))
        return 0
    keys = sys.stdin.fileno() if sys.stdin.isatty() else None
    with _screen(out, keys):
        while True:
            width = shutil.get_terminal_size().columns
            out.write(CLEAR + "\n".join(_frame(client, width, ascii_only)) + "\n")
            out.flush()
            deadline = time.monotonic() + args.interval
            while (left := deadline - time.monotonic()) > 0:
                if keys is None:
                    time.sleep(left)
                    break
                ready, _, _ = select.select([keys], [], [], left)
                if ready and os.read(keys, 32).lower().startswith(b"q"):
                    return 0


COMMANDS: Final[Sequence[Command]] = (
    Command(
        name="top",
        help="a live view of this node's GPUs: units, memory and SM bars, and each share",
        add_arguments=add_arguments,
        run=run,
        description=__doc__,
    ),
)
