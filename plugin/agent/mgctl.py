#!/usr/bin/env python3
"""mgctl: what metagpu knows about your GPU share, from inside a container or on the node.

    mgctl get processes [-o table|json|yaml] [--watch]
    mgctl get devices   [-o table|json|yaml] [--watch]
    mgctl get rightsize [-o table|json|yaml] [--watch]
    mgctl kill PID [--signal KILL|TERM|INT]
    mgctl version

It talks to the metagpu node agent over a unix socket: ``--socket``, else
``$METAGPU_AGENT_SOCKET`` (set in every metagpu container), else
``/var/run/metagpu/agent.sock``. The agent identifies the caller by the
kernel's peer credentials: in a container you see and may kill only your own
container's GPU processes and see only your own share; root on the node sees
everything. There is nothing to configure and no token to hold.

This file must import only the Python standard library (3.9 or newer): the
agent copies it next to its socket so that every container with a ``python3``
can run it, whatever its image holds.

Exit status: 0 success, 1 the agent could not be reached or failed, 2 bad
usage, 3 refused by the agent, 4 no such process/endpoint.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

API_VERSION = "v1"
DEFAULT_SOCKET = "/var/run/metagpu/agent.sock"
"""``CONTAINER_AGENT_DIR/AGENT_SOCKET_NAME`` (copied: this file imports nothing of metagpu)."""
ENV_SOCKET = "METAGPU_AGENT_SOCKET"
REQUEST_TIMEOUT_S = 10.0

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_NOT_FOUND = 4

_EMBEDDED_VERSION = "unknown"
"""Replaced by the agent's version when it installs this file next to its socket."""

Json = dict[str, Any]


def version() -> str:
    """The installed metagpu version, else the one the agent stamped into this copy."""
    try:
        return metadata.version("metagpu")
    except metadata.PackageNotFoundError:
        return _EMBEDDED_VERSION


# --------------------------------------------------------------------- client
class MgctlError(Exception):
    """An error for the user; ``exit_code`` says which kind."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


CONNECT_RETRY_S = (0.005, 0.1)
"""First and largest pause between connection attempts while the agent's backlog is full."""


class AgentBusyError(OSError):
    """The agent's accept backlog stayed full for the whole timeout."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a unix socket (``http.client`` only knows TCP).

    A unix socket whose accept backlog is full refuses a connection at once
    with ``EAGAIN`` ("Resource temporarily unavailable") instead of queueing
    it, as TCP would. Many containers running mgctl at once (a job's pods
    starting together) fill it for a moment, so mgctl waits and tries again
    until its timeout rather than failing.
    """

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path
        self.attempts = 0

    def connect(self) -> None:
        timeout = self.timeout if isinstance(self.timeout, (int, float)) else REQUEST_TIMEOUT_S
        deadline = time.monotonic() + timeout
        pause = CONNECT_RETRY_S[0]
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            self.attempts += 1
            try:
                sock.connect(self._path)
            except BlockingIOError:
                sock.close()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgentBusyError(
                        f"the agent stayed busy for {timeout:g} s (its connection backlog is full)"
                    ) from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, CONNECT_RETRY_S[1])
                continue
            except BaseException:
                sock.close()
                raise
            self.sock = sock
            return


class AgentClient:
    """Calls the agent's ``/v1`` API; every failure is an :class:`MgctlError`."""

    def __init__(self, socket_path: str, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def get(self, path: str) -> Json:
        return self._request("GET", path, None)

    def post(self, path: str, body: Json) -> Json:
        return self._request("POST", path, body)

    def _request(self, method: str, path: str, body: Json | None) -> Json:
        conn = _UnixConnection(self.socket_path, self.timeout_s)
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "User-Agent": "mgctl/" + version()}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, "/" + API_VERSION + path, body=payload, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except FileNotFoundError:
            raise MgctlError(self._unreachable("the socket does not exist")) from None
        except ConnectionRefusedError:
            raise MgctlError(
                self._unreachable("nothing is listening on it (the agent is down or restarting)")
            ) from None
        except PermissionError:
            raise MgctlError(
                self._unreachable("permission denied opening it (the agent makes it 0666)")
            ) from None
        except AgentBusyError as exc:
            raise MgctlError(
                f"the metagpu agent at {self.socket_path} did not answer: {exc}"
            ) from None
        except TimeoutError:
            raise MgctlError(
                f"the metagpu agent at {self.socket_path} did not answer "
                f"within {self.timeout_s:g} s"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise MgctlError(self._unreachable(str(exc) or type(exc).__name__)) from None
        finally:
            conn.close()
        try:
            doc = json.loads(raw.decode("utf-8"))
        except ValueError:
            raise MgctlError(
                f"the agent at {self.socket_path} answered {response.status} "
                "with something that is not JSON"
            ) from None
        if not isinstance(doc, dict):
            raise MgctlError("the agent answered with an unexpected document")
        if response.status >= 400:
            message = str(doc.get("message") or f"HTTP {response.status}")
            if response.status == 403:
                raise MgctlError("refused by the metagpu agent: " + message, EXIT_REFUSED)
            if response.status == 404:
                raise MgctlError(message, EXIT_NOT_FOUND)
            raise MgctlError("the metagpu agent failed: " + message)
        return doc

    def _unreachable(self, why: str) -> str:
        return (
            f"cannot reach the metagpu agent at {self.socket_path}: {why}.\n"
            "Check that:\n"
            "  - this pod requests a metagpu resource (the socket is mounted only into\n"
            f"    containers that hold GPU units; ${ENV_SOCKET} says where it is),\n"
            "  - the metagpu agent runs on this node (the pod of the metagpu-agent\n"
            "    DaemonSet on this node is Running and Ready),\n"
            f"  - or pass --socket PATH / set {ENV_SOCKET}."
        )


# ---------------------------------------------------------------- formatting
def fmt_mib(value: Any) -> str:
    """``12,288 MiB``; ``-`` when unknown."""
    return "-" if value is None else f"{int(value):,} MiB"


def fmt_pair_mib(used: Any, total: Any) -> str:
    """``2,048 / 40,960 MiB``: nvidia-smi's memory column."""
    a = "-" if used is None else f"{int(used):,}"
    b = "-" if total is None else f"{int(total):,}"
    return f"{a} / {b} MiB"


def fmt_percent(value: Any) -> str:
    return "-" if value is None else f"{value:g}%"


def fmt_share(item: Json) -> str:
    """``50 units (50%)``."""
    units = item.get("units")
    if not units:
        return "-"
    return "{} units ({:g}%)".format(units, item.get("sharePercent") or 0)


def fmt_limits(item: Json) -> str:
    """``mem enforced, sm 25% enforced``: each limit of a share and whether the node
    holds the container to it (``advisory`` where it does not); ``sm no cap`` for
    ``balance`` and ``none``; ``-`` for usage without a share."""
    limits = item.get("limits")
    if not isinstance(limits, dict):
        return "-"
    memory = limits.get("memory") or {}
    words = ["mem " + ("enforced" if memory.get("enforced") else "advisory")]
    sm = limits.get("sm")
    if isinstance(sm, dict):
        words.append(
            "sm {}% {}".format(sm.get("percent"), "enforced" if sm.get("enforced") else "advisory")
        )
    elif item.get("computePolicy"):
        words.append("sm no cap")
    return ", ".join(words)


def describe_mps(doc: Json) -> str | None:
    """The node's MPS in one line (None on a node without MPS: the LIMITS column
    already says every limit there is advisory)."""
    mps = doc.get("mps") or {}
    mode = mps.get("mode")
    if not mode or mode == "off":
        return None
    enforces = ", ".join(mps.get("enforces") or []) or "nothing"
    if mode == "unsupervised":
        return (
            "MPS: unsupervised (nobody watches the daemon; GPUs in DEFAULT compute mode): "
            "enforces " + enforces
        )
    daemon = mps.get("daemon") or {}
    state = daemon.get("state") or "?"
    line = "MPS: supervised daemon {} ({} restart(s)): enforces {}".format(
        state, daemon.get("restarts", 0), enforces
    )
    if state != "up" and daemon.get("reason"):
        line += "\n  " + str(daemon["reason"])
    return line


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()
) -> str:
    """Aligned columns with two spaces between; columns in ``right`` are right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers)] + [list(r) for r in rows]:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


UNRESOLVED_SHOWN = 10
"""Claim devices without a share named above a table; the rest are counted."""


def describe_scope(doc: Json) -> str:
    """The line above a table: whose view this is, from which reading."""
    caller = doc.get("caller") or {}
    if caller.get("scope") == "container":
        who = "container {}/{}/{}".format(
            caller.get("namespace"), caller.get("pod"), caller.get("container")
        )
    else:
        who = "whole node ({})".format(caller.get("via") or "host")
    line = "node {}  ·  {}  ·  reading of {}".format(
        doc.get("node") or "?", who, doc.get("takenAt") or "?"
    )
    stale = doc.get("stale") or []
    if stale:
        line += "  ·  STALE: {} unavailable, showing last known data".format(", ".join(stale))
    if doc.get("podsWatched") is False:
        line += "  ·  pods not watched (the agent has no node name): no pod names"
    if doc.get("noGpusReason"):
        line += "\nNO GPUS on this node: {}".format(doc["noGpusReason"])
    unresolved = doc.get("unresolvedShares") or []
    for u in unresolved[:UNRESOLVED_SHOWN]:
        # A DRA claim the agent cannot account for: no share, no limit, so say why.
        line += "\nNO SHARE for {}/{}/{} (claim {}, device {}): {}".format(
            u.get("namespace"),
            u.get("pod"),
            u.get("container"),
            u.get("claim"),
            u.get("device"),
            u.get("reason"),
        )
    more = len(unresolved) - UNRESOLVED_SHOWN
    if more > 0:
        line += f"\n... and {more} more claim devices without a share (-o yaml lists them)"
    mps = describe_mps(doc)
    if mps is not None:
        line += "\n" + mps
    return line


def render_processes(doc: Json) -> str:
    items: list[Json] = doc.get("items") or []
    if not items:
        return describe_scope(doc) + "\n\nNo GPU processes."
    rows = []
    for p in sorted(items, key=lambda x: (x.get("gpuIndex", 0), x.get("pid", 0))):
        rows.append(
            [
                str(p.get("gpuIndex", "-")),
                str(p.get("pid", "-")),
                p.get("namespace") or "-",
                p.get("pod") or ("(host)" if not p.get("containerId") else "(unknown)"),
                p.get("container") or "-",
                fmt_mib(p.get("usedMemoryMiB")),
                fmt_mib(p.get("memoryLimitMiB")),
                fmt_share(p),
                fmt_percent(p.get("utilizationPercent")),
                p.get("command") or "",
            ]
        )
    table = render_table(
        [
            "GPU",
            "PID",
            "NAMESPACE",
            "POD",
            "CONTAINER",
            "MEMORY",
            "LIMIT",
            "SHARE",
            "SM",
            "COMMAND",
        ],
        rows,
        right=(0, 1, 5, 6, 8),
    )
    return describe_scope(doc) + "\n\n" + table


def _gpu_health(g: Json) -> str:
    others = ", ".join((g.get("otherOwner") or {}).get("resources") or [])
    if others and g.get("resource"):
        return f"Withdrawn: also {others}"
    if others:
        return f"Served by {others}"
    return "Healthy" if g.get("healthy") else "Unhealthy: {}".format(g.get("problem") or "?")


def render_devices(doc: Json) -> str:
    items: list[Json] = doc.get("items") or []
    header = describe_scope(doc)
    if (doc.get("caller") or {}).get("scope") == "container":
        if not items:
            return header + "\n\nThis container holds no GPU share on this node."
        rows = []
        for g in items:
            share = g.get("share") or {}
            rows.append(
                [
                    str(g.get("index")),
                    g.get("name", ""),
                    g.get("uuid", ""),
                    fmt_share(share),
                    fmt_pair_mib(share.get("memoryUsedMiB"), share.get("memoryLimitMiB")),
                    fmt_mib(g.get("memoryTotalMiB")),
                    fmt_percent(share.get("utilizationPercent")),
                    fmt_limits(share),
                    "CONFLICT: also {}".format(", ".join(g["otherOwner"]["resources"]))
                    if (g.get("otherOwner") or {}).get("resources")
                    else ("OVER LIMIT" if share.get("overLimit") else "ok"),
                ]
            )
        table = render_table(
            [
                "GPU",
                "NAME",
                "UUID",
                "SHARE",
                "MEMORY USED / LIMIT",
                "GPU MEMORY",
                "SM",
                "LIMITS",
                "STATUS",
            ],
            rows,
            right=(0, 4, 5, 6),
        )
        return header + "\n\n" + table
    if not items:
        return header + "\n\nNo GPUs on this node."
    rows = []
    share_rows = []
    conflict_lines: list[str] = []
    for g in items:
        other = g.get("otherOwner") or {}
        if other and g.get("resource"):
            conflict_lines.append(
                "GPU {}: also handed out by {}; its units are withdrawn.".format(
                    g.get("index"), ", ".join(other.get("resources") or [])
                )
            )
            for c in other.get("conflicts") or []:
                conflict_lines.append(
                    "  CONFLICT: {}/{}/{} holds {} unit(s); {}/{}/{} holds it through {}".format(
                        c.get("namespace"),
                        c.get("pod"),
                        c.get("container"),
                        c.get("units"),
                        c.get("otherNamespace"),
                        c.get("otherPod"),
                        c.get("otherContainer"),
                        c.get("otherResource"),
                    )
                )
        rows.append(
            [
                str(g.get("index")),
                g.get("name", ""),
                g.get("uuid", ""),
                fmt_pair_mib(g.get("memoryUsedMiB"), g.get("memoryTotalMiB")),
                fmt_percent(g.get("utilizationPercent")),
                "{}/{}".format(g.get("unitsAllocated", 0), g.get("unitsTotal", 0)),
                str(g.get("processes", 0)),
                _gpu_health(g),
            ]
        )
        for s in g.get("shares") or []:
            share_rows.append(
                [
                    str(g.get("index")),
                    s.get("namespace", ""),
                    s.get("pod", ""),
                    s.get("container", ""),
                    fmt_share(s),
                    fmt_pair_mib(s.get("memoryUsedMiB"), s.get("memoryLimitMiB")),
                    fmt_percent(s.get("utilizationPercent")),
                    fmt_limits(s),
                    "OVER LIMIT"
                    if s.get("overLimit")
                    else ("no share" if not s.get("units") else "ok"),
                ]
            )
    out = (
        header
        + "\n\n"
        + render_table(
            ["GPU", "NAME", "UUID", "MEMORY USED / TOTAL", "SM", "UNITS", "PROCS", "HEALTH"],
            rows,
            right=(0, 3, 4, 5, 6),
        )
    )
    if share_rows:
        out += "\n\n" + render_table(
            [
                "GPU",
                "NAMESPACE",
                "POD",
                "CONTAINER",
                "SHARE",
                "MEMORY USED / LIMIT",
                "SM",
                "LIMITS",
                "STATUS",
            ],
            share_rows,
            right=(0, 5, 6),
        )
    if conflict_lines:
        out += (
            "\n\nAnother device plugin hands out GPUs metagpu serves "
            "(docs/install.md#one-owner-per-gpu):\n" + "\n".join(conflict_lines)
        )
    return out


def fmt_duration(seconds: Any) -> str:
    """``3 h 20 min``, ``45 min``, ``30 s``: whole minutes past a minute."""
    total = int(seconds or 0)
    if total < 60:
        return f"{total} s"
    hours, minutes = divmod(total // 60, 60)
    if not hours:
        return f"{minutes} min"
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


SPANS = {
    "agent-start": "since the agent started",
    "share-start": "since the share began",
}
"""Why a peak covers less than the window (the agent keeps no history across restarts)."""

RIGHTSIZE_NOTE = (
    "RECOMMENDED is the peak GPU memory plus {headroom}%, in whole units (at least 1), as "
    "`metagpu usage --rightsize`\nand the recording rule metagpu:container_recommended_units:1d. "
    "The agent keeps this window in memory only:\na restart of the agent starts it over."
)


def fmt_peak_span(rightsize: Json) -> str:
    """``peak over the last 3 h 20 min (since the agent started)``."""
    covered = fmt_duration(rightsize.get("coveredS"))
    why = SPANS.get(str(rightsize.get("span")))
    if why is None:
        return f"last {covered}"
    return f"last {covered} ({why})"


def fmt_peak_mib(rightsize: Json, total_mib: Any) -> str:
    """``9,216 MiB (11.3%)``: the peak and what it is of the GPU's memory."""
    peak = rightsize.get("memoryPeakMiB")
    if peak is None:
        return "-"
    if not total_mib:
        return fmt_mib(peak)
    return f"{int(peak):,} MiB ({100 * peak / total_mib:.1f}%)"


def fmt_change(units: Any, recommended: Any) -> str:
    """``-28 units`` (give back), ``+5 units`` (ask for more), ``keep``."""
    if not isinstance(units, int) or not isinstance(recommended, int):
        return "-"
    delta = recommended - units
    return "keep" if delta == 0 else f"{delta:+d} units"


def render_rightsize(doc: Json) -> str:
    """The share each container needs, from the agent's own window of its peak use."""
    items: list[Json] = doc.get("items") or []
    header = describe_scope(doc)
    container = (doc.get("caller") or {}).get("scope") == "container"
    entries: list[tuple[Json, Json, Json | None]] = []  # (gpu, share, its owner)
    for g in items:
        if container:
            if g.get("share"):
                entries.append((g, g["share"], None))
        else:
            entries.extend((g, s, s) for s in g.get("shares") or [] if s.get("units"))
    if not entries:
        held = "This container holds" if container else "No container holds"
        return header + "\n\n" + held + " no GPU share on this node."
    rows = []
    old_agent = False
    headroom = 10
    for g, share, owner in entries:
        rightsize = share.get("rightsize")
        old_agent = old_agent or "rightsize" not in share
        row = [str(g.get("index"))]
        if owner is not None:
            row += [owner.get("namespace", ""), owner.get("pod", ""), owner.get("container", "")]
        if isinstance(rightsize, dict):
            headroom = rightsize.get("headroomPercent", headroom)
            sm = rightsize.get("smPeakPercent")
            row += [
                fmt_share(share),
                fmt_peak_mib(rightsize, g.get("memoryTotalMiB")),
                fmt_percent(sm),
                "{} units".format(rightsize.get("recommendedUnits")),
                fmt_change(share.get("units"), rightsize.get("recommendedUnits")),
                fmt_peak_span(rightsize),
            ]
        else:
            row += [fmt_share(share), "-", "-", "-", "-", "no reading yet"]
        rows.append(row)
    names = ["GPU"] + (["NAMESPACE", "POD", "CONTAINER"] if not container else [])
    names += ["SHARE", "MEMORY PEAK", "SM PEAK", "RECOMMENDED", "CHANGE", "PEAK OVER"]
    shift = 0 if container else 3
    table = render_table(names, rows, right=(0, 2 + shift, 3 + shift))
    out = header + "\n\n" + table + "\n\n" + RIGHTSIZE_NOTE.format(headroom=headroom)
    if old_agent:
        out += (
            "\nThis agent keeps no usage history (it predates right-sizing): "
            "upgrade metagpu on this node."
        )
    return out


# ---------------------------------------------------------------------- YAML
_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./@+-]*(?: [A-Za-z0-9_./@+()-]+)*$")
_UNPRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")
"""Characters YAML forbids, or reads as line breaks, in a scalar; JSON leaves them raw."""
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"}


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # YAML 1.1 readers (PyYAML) need a dot in the mantissa: 1e+16 would be a string.
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:
            text = f"{mantissa}.0e{exponent}"
        return text
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    # A JSON string is a valid YAML double-quoted scalar once the characters
    # in _UNPRINTABLE are escaped as well.
    quoted = json.dumps(text, ensure_ascii=False)
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML emitter for JSON-shaped data (no PyYAML in arbitrary images).

    Block style for mappings and sequences, plain scalars where unambiguous and
    double-quoted JSON strings otherwise, so ``yaml.safe_load`` gives back the
    same data.
    """
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}"
        lines = []
        for key, item in value.items():
            k = _yaml_scalar(str(key))
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{k}:\n{to_yaml(item, indent + 1)}")
            else:
                lines.append(f"{pad}{k}: {to_yaml(item, 0).strip()}")
        return "\n".join(lines)
    if isinstance(value, list):
        if not value:
            return pad + "[]"
        lines = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                body = to_yaml(item, indent + 1)
                lines.append(f"{pad}- {body[len(pad) + 2 :]}")
            else:
                lines.append(f"{pad}- {to_yaml(item, 0).strip()}")
        return "\n".join(lines)
    return pad + _yaml_scalar(value)


# ---------------------------------------------------------------------- CLI
def render(doc: Json, output: str, table: Callable[[Json], str]) -> str:
    """The document as a table, indented JSON or YAML."""
    if output == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False)
    if output == "yaml":
        return to_yaml(doc)
    return table(doc)


def cmd_get(client: AgentClient, args: argparse.Namespace) -> int:
    path, table = _GETTERS[args.what]
    if not args.watch:
        print(render(client.get(path), args.output, table))
        return EXIT_OK
    # --watch: tables redraw in place on a terminal; JSON is one document per line
    # (JSON Lines) and YAML a stream of documents, so both can be piped.
    redraw = sys.stdout.isatty() and args.output == "table"
    first = True
    try:
        while True:
            try:
                doc = client.get(path)
            except MgctlError as exc:
                if exc.exit_code in (EXIT_REFUSED, EXIT_NOT_FOUND):
                    raise
                print(f"mgctl: {exc}", file=sys.stderr, flush=True)
            else:
                if args.output == "json":
                    text = json.dumps(doc, ensure_ascii=False)
                elif args.output == "yaml":
                    text = ("" if first else "---\n") + to_yaml(doc)
                elif redraw:
                    text = "\x1b[H\x1b[2J" + time.strftime("%H:%M:%S  ") + table(doc)
                else:
                    text = ("" if first else "\n") + table(doc)
                print(text, flush=True)
                first = False
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK


_GETTERS: dict[str, tuple[str, Callable[[Json], str]]] = {
    "processes": ("/processes", render_processes),
    "devices": ("/devices", render_devices),
    "rightsize": ("/devices", render_rightsize),
}


def cmd_kill(client: AgentClient, args: argparse.Namespace) -> int:
    doc = client.post("/kill", {"pid": args.pid, "signal": args.signal})
    if doc.get("result") == "gone":
        print(f"process {args.pid} had already exited")
    else:
        print("sent SIG{} to GPU process {}".format(doc.get("signal", args.signal), args.pid))
    return EXIT_OK


def cmd_version(client: AgentClient, args: argparse.Namespace) -> int:
    print(f"mgctl:  {version()} (API {API_VERSION})")
    try:
        doc = client.get("/version")
    except MgctlError as exc:
        print(f"agent:  unreachable: {exc}", file=sys.stderr)
        return exc.exit_code
    print(
        "agent:  {} (API {}) on node {}, GPU backend {}".format(
            doc.get("agentVersion"),
            doc.get("apiVersion"),
            doc.get("node") or "?",
            doc.get("backend"),
        )
    )
    return EXIT_OK


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mgctl",
        description="Show and manage your metagpu GPU share (talks to the metagpu node agent).",
    )
    parser.add_argument(
        "--socket",
        default=None,
        help=f"agent socket (default ${ENV_SOCKET} or {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=REQUEST_TIMEOUT_S, help="seconds per request"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    get = sub.add_parser(
        "get",
        help="list GPU processes, devices, or the share each container needs (rightsize)",
    )
    get.add_argument("what", choices=tuple(_GETTERS))
    get.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    get.add_argument("-w", "--watch", action="store_true", help="refresh until interrupted")
    get.add_argument(
        "--interval", type=positive_float, default=2.0, help="seconds between refreshes (--watch)"
    )
    get.set_defaults(run=cmd_get)

    kill = sub.add_parser("kill", help="kill one of your GPU processes (PID from get processes)")
    kill.add_argument("pid", type=int)
    kill.add_argument(
        "-s",
        "--signal",
        type=str.upper,
        choices=("KILL", "TERM", "INT"),
        default="KILL",
        help="signal to send (default KILL: a process stuck in a CUDA call ignores TERM)",
    )
    kill.set_defaults(run=cmd_kill)

    ver = sub.add_parser("version", help="print mgctl's and the agent's versions")
    ver.set_defaults(run=cmd_version)
    return parser


def socket_path(arg: str | None) -> str:
    return arg or os.environ.get(ENV_SOCKET) or DEFAULT_SOCKET


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mgctl`` console script and of the installed file."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    client = AgentClient(socket_path(args.socket), timeout_s=args.timeout)
    try:
        code: int = args.run(client, args)
    except MgctlError as exc:
        print(f"mgctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # mgctl get processes | head
        return EXIT_OK
    return code


if __name__ == "__main__":
    raise SystemExit(main())
