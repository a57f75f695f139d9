"""``metagpu top``: a live picture of one node's GPUs, refreshing like ``top``.

It reads the node agent's ``GET /v1/devices`` over the agent's socket, as
``mgctl get devices`` does (node scope: root on the node, or ``kubectl exec``
into the agent pod; a container sees its own shares). The frame itself is
:func:`metagpu.top_view.render_screen`, pure; this module decides when to draw
and how:

* on a terminal: the alternate screen with the cursor hidden, redrawn in
  place every ``--interval`` seconds, at once on a resize or any key, until
  ``q`` (or Ctrl-C, or SIGTERM); the terminal's modes and screen are restored
  however it ends;
* piped, or with ``-n/--iterations``: plain frames with no escape codes, one
  after another (``-n`` of them, or until interrupted), for scripts and logs.

Why ``metagpu top`` and not ``mgctl top``: ``mgctl`` is one standard-library
file copied into every tenant container, and tenants have no node scope to
draw; the node view belongs where the operator has it (the agent's image and
the host, where ``metagpu`` is installed). A tenant keeps ``mgctl get devices
--watch``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any, Final, Literal, TextIO

from metagpu.top_view import render_error, render_screen
from plugin.agent.mgctl import AgentClient, MgctlError, positive_float, socket_path
from plugin.api.commands import EXIT_FAILURE, EXIT_OK, Command

ENTER_SCREEN: Final = "\x1b[?1049h\x1b[?25l"
"""Alternate screen, cursor hidden (as top does): the shell's screen comes back on exit."""
LEAVE_SCREEN: Final = "\x1b[?25h\x1b[?1049l"
HOME: Final = "\x1b[H"
ERASE_LINE: Final = "\x1b[K"
ERASE_BELOW: Final = "\x1b[J"
QUIT_KEYS: Final = frozenset(b"qQ")
PIPED_WIDTH: Final = 120
"""Width of a frame written to a pipe without ``$COLUMNS``: wide enough for a row's
limits, narrow enough for a log viewer."""
DEFAULT_INTERVAL_S: Final = 2.0
"""top's own default is 3 s; the agent reads every 5 s by default, so 2 s shows each
reading within a second or two without asking the agent more often than it changes."""
REQUEST_TIMEOUT_S: Final = 5.0
"""Shorter than mgctl's 10 s: a stalled agent shows as a reason on screen sooner
(keys are answered meanwhile: requests run in a thread)."""
Json = dict[str, Any]


class _StopError(Exception):
    """SIGTERM while drawing: leave through the same ``finally`` as ``q``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket",
        default=None,
        help="the agent's socket (default $METAGPU_AGENT_SOCKET or /var/run/metagpu/agent.sock)",
    )
    parser.add_argument(
        "-d",
        "--interval",
        type=positive_float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between refreshes (default %(default)g)",
    )
    parser.add_argument(
        "-n",
        "--iterations",
        type=_positive_int,
        default=None,
        help="batch mode: print N plain frames (no escape codes), --interval apart, and exit",
    )
    parser.add_argument("--once", action="store_true", help="the same as -n 1")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=REQUEST_TIMEOUT_S,
        help="seconds per request (default %(default)g)",
    )


def run(args: argparse.Namespace) -> int:
    client = AgentClient(socket_path(args.socket), timeout_s=args.timeout)
    out = sys.stdout
    iterations = 1 if args.once else args.iterations
    if iterations is not None or not out.isatty():
        return _batch(client, out, iterations=iterations, interval_s=args.interval)
    keys = sys.stdin.fileno() if sys.stdin.isatty() else None
    return _live(client, out, keys=keys, interval_s=args.interval)


# ------------------------------------------------------------------- batch
def _batch(client: AgentClient, out: TextIO, *, iterations: int | None, interval_s: float) -> int:
    """Plain frames, a blank line apart; an agent that fails ends it with exit 1.

    Failing rather than retrying: a script that asked for N frames should not
    wait N timeouts to learn the agent is not there.
    """
    ascii_only = _ascii_only(out)
    count = 0
    try:
        while iterations is None or count < iterations:
            if count:
                time.sleep(interval_s)  # nothing to react to without a terminal
            try:
                doc = client.get("/devices")
            except MgctlError as exc:
                print(f"metagpu top: {exc}", file=sys.stderr)
                return exc.exit_code or EXIT_FAILURE
            width = shutil.get_terminal_size((PIPED_WIDTH, 24)).columns
            frame = render_screen(doc, width=width, ascii_only=ascii_only)
            out.write(("\n" if count else "") + "\n".join(frame) + "\n")
            out.flush()
            count += 1
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # metagpu top | head
        # As the Python docs advise: point stdout at /dev/null so the flush at
        # exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_OK
    return EXIT_OK


# -------------------------------------------------------------------- live
Reading = tuple[Json | None, str | None]
"""The agent's document, or why there is none."""


class _Fetcher:
    """Reads ``/devices`` in a daemon thread, one request at a time, so ``q`` and a
    resize are answered at once even while the agent takes its whole timeout.

    A result is kept (only the latest: bounded) and announced by a byte on the
    wake-up pipe the loop already selects on. :meth:`close` is called before
    that pipe is closed, so a request still running cannot write into whatever
    file later gets its descriptor number.
    """

    def __init__(self, client: AgentClient, wake_w: int) -> None:
        self._client = client
        self._wake_w = wake_w
        self._lock = threading.Lock()
        self._busy = False
        self._closed = False
        self._latest: Reading | None = None

    def request(self) -> None:
        """Start a read unless one is running (that one's answer is as fresh)."""
        with self._lock:
            if self._busy or self._closed:
                return
            self._busy = True
        threading.Thread(target=self._read, name="metagpu-top-read", daemon=True).start()

    def take(self) -> Reading | None:
        with self._lock:
            latest, self._latest = self._latest, None
        return latest

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _read(self) -> None:
        result: Reading
        try:
            result = (self._client.get("/devices"), None)
        except MgctlError as exc:
            result = (None, str(exc))
        with self._lock:
            self._busy = False
            if self._closed:
                return
            self._latest = result
            with contextlib.suppress(OSError):  # full pipe: a wake-up is pending anyway
                os.write(self._wake_w, b"\0")


def _live(client: AgentClient, out: TextIO, *, keys: int | None, interval_s: float) -> int:
    hint = f"q quits, every {interval_s:g}s"
    ascii_only = _ascii_only(out)
    reading: Reading = (None, None)
    with _terminal(out, keys) as (wake_r, wake_w):
        fetcher = _Fetcher(client, wake_w)
        try:
            next_read = time.monotonic()
            while True:
                if time.monotonic() >= next_read:
                    fetcher.request()
                    next_read = time.monotonic() + interval_s
                size = os.get_terminal_size(out.fileno())
                frame = _frame(reading, client.socket_path, size, ascii_only=ascii_only, hint=hint)
                out.write(_draw(frame[: size.lines]))
                out.flush()
                event = _wait(keys, wake_r, until=next_read)
                if event == "quit":
                    return EXIT_OK
                if event == "key":
                    next_read = time.monotonic()  # any other key: read now, as top does
                if (latest := fetcher.take()) is not None:
                    reading = latest
        except (KeyboardInterrupt, _StopError):
            return EXIT_OK
        finally:
            fetcher.close()


def _frame(
    reading: Reading,
    socket: str,
    size: os.terminal_size,
    *,
    ascii_only: bool,
    hint: str,
) -> list[str]:
    doc, problem = reading
    if doc is not None:
        return render_screen(
            doc, width=size.columns, height=size.lines, ascii_only=ascii_only, hint=hint
        )
    if problem is not None:
        return render_error(problem, width=size.columns, hint=hint)
    return render_error(
        f"waiting for the metagpu agent at {socket}", width=size.columns, hint=hint, retrying=False
    )


def _draw(frame: Sequence[str]) -> str:
    """In place: home, each line then erase its rest, erase below. No full clear,
    so a redraw does not flicker."""
    return (
        HOME
        + "".join(line + ERASE_LINE + "\r\n" for line in frame[:-1])
        + ((frame[-1] + ERASE_LINE if frame else "") + ERASE_BELOW)
    )


Event = Literal["quit", "key", "wake", "time"]


def _wait(keys: int | None, wake: int, *, until: float) -> Event:
    """Until ``until`` (monotonic) or something happens first: ``q`` pressed, another
    key, or a wake-up (a reading arrived, or a resize: SIGWINCH's wake-up byte)."""
    watched = [wake] if keys is None else [keys, wake]
    while (left := until - time.monotonic()) > 0:
        ready, _, _ = select.select(watched, [], [], left)
        if keys is not None and keys in ready:
            pressed = os.read(keys, 64)
            if not pressed or any(k in QUIT_KEYS for k in pressed):
                return "quit"  # q, or the terminal went away
            return "key"
        if wake in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake, 512)
            return "wake"
    return "time"


@contextlib.contextmanager
def _terminal(out: TextIO, keys: int | None) -> Iterator[tuple[int, int]]:
    """Alternate screen and cbreak keys (no echo, one key at a time, Ctrl-C still a
    signal); yields a wake-up pipe (read end, write end) that a resize writes to.
    Everything is put back on the way out, whatever the way out is."""
    saved = termios.tcgetattr(keys) if keys is not None else None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    old_winch = signal.signal(signal.SIGWINCH, lambda *_: None)  # the wake-up fd does the work
    old_term = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        if keys is not None:
            tty.setcbreak(keys, termios.TCSANOW)
        out.write(ENTER_SCREEN)
        out.flush()
        yield wake_r, wake_w
    finally:
        with contextlib.suppress(OSError):
            out.write(LEAVE_SCREEN)
            out.flush()
        if keys is not None and saved is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(keys, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGWINCH, old_winch)
        signal.set_wakeup_fd(old_wakeup)
        os.close(wake_r)
        os.close(wake_w)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _StopError


def _ascii_only(out: TextIO) -> bool:
    """Block characters only where the output encoding can carry them."""
    return (getattr(out, "encoding", "") or "").lower().replace("-", "") != "utf8"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


DESCRIPTION: Final = """\
A live view of one node's GPUs from the metagpu node agent: per GPU a bar for
units allocated, memory used and SM used, then a row per container holding a
share (its share, memory used against its limit, SM, and whether the node
enforces its limits). Run it on the node as root or in the agent's pod:

  kubectl -n metagpu exec -it <agent pod> -- metagpu top

On a terminal it redraws every --interval seconds (at once on a resize or a
key) until q. With -n N, --once, or output to a pipe it prints plain frames
with no escape codes, for scripts."""


COMMANDS: Final[Sequence[Command]] = (
    Command(
        name="top",
        help="a live view of this node's GPUs: units, memory and SM bars, and each share",
        add_arguments=add_arguments,
        run=run,
        description=DESCRIPTION,
    ),
)
