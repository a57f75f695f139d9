"""The frame ``metagpu top`` draws: a ``DeviceList`` document and a terminal size in, lines out.

Pure (no I/O, no terminal), so every width, height and document shape is a
unit test, and the terminal loop in :mod:`metagpu.top` only decides when to
draw and where. The numbers and words match ``mgctl get devices`` (the same
formatting helpers from :mod:`plugin.agent.mgctl`), so the two never disagree.

Node scope (root on the node, the agent's container): per GPU a bar each for
units allocated, memory used and SM used, then a row per container holding a
share of it. Container scope (a tenant's own view): per GPU the caller holds
units of, a bar for its memory against its limit and one for its SM use.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any, Final

from plugin.agent.mgctl import describe_mps, fmt_limits, fmt_pair_mib, fmt_percent

Json = dict[str, Any]

BAR_MAX: Final = 40
"""Wider bars add no precision a person reads, and leave the numbers far from the label."""
BAR_MIN: Final = 4
"""Below this a bar says less than its number, so narrow terminals get the number alone."""
LABEL_WIDTH: Final = 9
"""``  memory `` : the indent and the longest bar label."""
TEXT_ROOM: Final = len("100,000 / 100,000 MiB")
"""Room kept right of a bar for its number, so every bar of a frame has one width
(a 192 GiB GPU's memory still fits)."""
MIN_WIDTH: Final = 20
"""Narrower terminals still get lines, cut at 20 columns rather than at nothing."""


def bar(fraction: float | None, width: int, *, ascii_only: bool = False) -> str:
    """``[████░░░░]``: ``fraction`` (clamped to 0-1) of ``width`` cells; ``[????]`` when unknown.

    ``ascii_only`` for terminals whose encoding cannot show block characters
    (a C locale, a serial console).
    """
    full, empty = ("#", ".") if ascii_only else ("█", "░")
    if fraction is None:
        return "[" + "?" * width + "]"
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + full * filled + empty * (width - filled) + "]"


def render_screen(
    doc: Json,
    *,
    width: int,
    height: int | None = None,
    ascii_only: bool = False,
    hint: str = "",
) -> list[str]:
    """The lines of one frame, none wider than ``width`` and at most ``height`` of them.

    ``hint`` ends the header (``q quits, every 2s``); the loop passes it, a
    batch frame for a script leaves it out. When the frame is taller than
    ``height`` its last line says how many lines did not fit, so a full
    screen never hides that there is more.
    """
    width = max(width, MIN_WIDTH)
    lines = _header(doc, hint)
    items = [g for g in doc.get("items") or [] if isinstance(g, dict)]
    container_scope = (doc.get("caller") or {}).get("scope") == "container"
    if not items:
        reason = doc.get("noGpusReason")
        if container_scope:
            lines.append("this container holds no GPU units")
        else:
            lines.append("no GPUs on this node" + (f": {reason}" if reason else ""))
    for gpu in items:
        if container_scope:
            lines += _own_share(gpu, width=width, ascii_only=ascii_only)
        else:
            lines += _gpu_block(gpu, width=width, ascii_only=ascii_only)
        lines.append("")
    while lines and not lines[-1]:
        lines.pop()
    lines = [_cut(line, width) for line in lines]
    if height is not None and len(lines) > max(height, 1):
        keep = max(height, 1) - 1
        hidden = len(lines) - keep
        lines = [*lines[:keep], _cut(f"... {hidden} more line(s): enlarge the terminal", width)]
    return lines


def render_error(message: str, *, width: int, hint: str = "", retrying: bool = True) -> list[str]:
    """A frame for an agent that did not answer (the live view keeps retrying), or,
    with ``retrying=False``, one that says what it waits for.

    Wrapped, not cut: the reason is what the operator needs to read.
    """
    width = max(width, MIN_WIDTH)
    head = "metagpu top" + (f"  ({hint})" if hint else "")
    body = [
        wrapped
        for line in message.splitlines()
        for wrapped in textwrap.wrap(
            line, width, initial_indent="  ", subsequent_indent="    ", break_long_words=True
        )
    ]
    tail = ["", "  (retrying)"] if retrying else []
    return [_cut(line, width) for line in [head, "", *body, *tail]]


# ------------------------------------------------------------------- pieces
def _header(doc: Json, hint: str) -> list[str]:
    parts = [f"metagpu top  node {doc.get('node') or '(no name)'}"]
    caller = doc.get("caller") or {}
    if caller.get("scope") == "container":
        parts.append(
            "container {}/{}/{}".format(
                caller.get("namespace"), caller.get("pod"), caller.get("container")
            )
        )
    parts.append(f"at {doc.get('takenAt') or 'no reading yet'}")
    stale = doc.get("stale") or []
    if stale:
        parts.append("STALE: " + ", ".join(str(s) for s in stale))
    if hint:
        parts.append(f"({hint})")
    lines = ["  ".join(parts)]
    mps = describe_mps(doc)
    if mps:
        lines += mps.splitlines()
    return [*lines, ""]


def _bar_row(label: str, fraction: float | None, text: str, *, width: int, ascii_only: bool) -> str:
    """``  memory [████░░░░]  31,000 / 81,920 MiB``; the bar shrinks to fit, then goes."""
    room = width - LABEL_WIDTH - 2 - 2 - TEXT_ROOM  # the brackets, the gap before the text
    if room < BAR_MIN:
        return f"  {label:<{LABEL_WIDTH - 2}}{text}"
    cells = min(BAR_MAX, room)
    return f"  {label:<{LABEL_WIDTH - 2}}{bar(fraction, cells, ascii_only=ascii_only)}  {text}"


def _gpu_title(gpu: Json) -> str:
    health = gpu.get("health") or {}
    if gpu.get("healthy", True) and health.get("state", "Healthy") == "Healthy":
        state = "healthy"
    else:
        reason = health.get("reason") or gpu.get("problem") or "no reason given"
        state = f"UNHEALTHY: {reason}"
    return f"GPU {gpu.get('index')}  {gpu.get('name') or '?'}  {state}"


def _gpu_block(gpu: Json, *, width: int, ascii_only: bool) -> list[str]:
    total, allocated = gpu.get("unitsTotal") or 0, gpu.get("unitsAllocated") or 0
    used, mem_total = gpu.get("memoryUsedMiB"), gpu.get("memoryTotalMiB")
    util = gpu.get("utilizationPercent")
    lines = [_gpu_title(gpu)]
    rows: list[tuple[str, float | None, str]] = [
        ("units", _ratio(allocated, total), f"{allocated}/{total} allocated"),
        ("memory", _ratio(used, mem_total), fmt_pair_mib(used, mem_total)),
        ("SM", None if util is None else float(util) / 100, fmt_percent(util)),
    ]
    lines += [_bar_row(*row, width=width, ascii_only=ascii_only) for row in rows]
    other = gpu.get("otherOwner")
    if isinstance(other, dict):
        resources = ", ".join(str(r) for r in other.get("resources") or []) or "another plugin"
        lines.append(f"  also handed out by {resources}: its units are withdrawn")
    shares = [s for s in gpu.get("shares") or [] if isinstance(s, dict)]
    if shares:
        lines += _share_table(shares, width=width)
    return lines


def _own_share(gpu: Json, *, width: int, ascii_only: bool) -> list[str]:
    """A tenant's view of one GPU: its share, memory against its limit, its SM."""
    share = gpu.get("share") or {}
    used, limit = share.get("memoryUsedMiB"), share.get("memoryLimitMiB")
    util = share.get("utilizationPercent")
    title = f"GPU {gpu.get('index')}  {gpu.get('name') or '?'}  share {_share(share)}"
    memory = fmt_pair_mib(used, limit) + (" OVER" if share.get("overLimit") else "")
    lines = [
        title,
        _bar_row("memory", _ratio(used, limit), memory, width=width, ascii_only=ascii_only),
        _bar_row(
            "SM",
            None if util is None else float(util) / 100,
            fmt_percent(util),
            width=width,
            ascii_only=ascii_only,
        ),
        f"  limits {fmt_limits(share)}",
    ]
    if isinstance(gpu.get("otherOwner"), dict):
        lines.append("  CONFLICT: also handed out by " + ", ".join(gpu["otherOwner"]["resources"]))
    return lines


SHARE_HEADERS: Final = ("CONTAINER", "SHARE", "MEMORY USED / LIMIT", "SM", "LIMITS")


def _share_table(shares: Sequence[Json], *, width: int) -> list[str]:
    """One row per share; on a narrow terminal LIMITS goes first, then SM, and the
    container name is shortened from the left (its container name is kept)."""
    rows = [
        [
            f"{s.get('namespace')}/{s.get('pod')}/{s.get('container')}",
            _share(s),
            fmt_pair_mib(s.get("memoryUsedMiB"), s.get("memoryLimitMiB"))
            + (" OVER" if s.get("overLimit") else ""),
            fmt_percent(s.get("utilizationPercent")),
            fmt_limits(s),
        ]
        for s in shares
    ]
    headers = list(SHARE_HEADERS)
    columns = len(headers)
    name_min = 8
    while True:
        widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) for i in range(columns)]
        rest = sum(widths[1:]) + 2 * (columns - 1) + 2  # the indent, two spaces between
        if columns <= 3 or rest + min(widths[0], name_min) <= width:
            break
        columns -= 1  # drop LIMITS, then SM
    widths[0] = max(min(widths[0], width - rest), min(widths[0], name_min))
    right = {1, 3}
    out = []
    for row in [headers, *rows]:
        cells = [_shorten(row[0], widths[0]), *row[1:columns]]
        padded = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        out.append(("  " + "  ".join(padded)).rstrip())
    return out


# ------------------------------------------------------------------ numbers
def _ratio(part: Any, whole: Any) -> float | None:
    if part is None or not whole:
        return None
    return float(part) / float(whole)


def _share(share: Json) -> str:
    """``25%`` of the GPU (``-`` for a container using a GPU it holds no units of)."""
    if not share.get("units"):
        return "-"
    return f"{share.get('sharePercent') or 0:g}%"


def _shorten(text: str, width: int) -> str:
    """Keep the end (the container name tells rows of one pod apart); ``~`` marks the cut
    (ASCII: any terminal shows it)."""
    if len(text) <= width:
        return text
    return "~" + text[len(text) - width + 1 :] if width > 1 else text[:width]


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width]
