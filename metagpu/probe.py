"""``python -m metagpu.probe URL``: an exec probe that answers in one line.

The scheduler extender listens on loopback only (nothing but the kube-scheduler
beside it may call its bind verb), so the kubelet cannot probe it over HTTP and
the chart probes it from inside its container. A bare ``urllib.request.urlopen``
did that, and every failed probe during start-up put a 40-line Python traceback
(``URLError ... Connection refused``) into the pod's Events. The kubelet shows
what an exec probe prints, so this prints one line saying what failed, with the
start of the answer's body (the extender's ``/readyz`` says why it is not
ready), and exits 1; 0 when the answer is 2xx.

Standard library only, and nothing of metagpu is imported: a probe runs every
few seconds and must start fast.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Final

TIMEOUT_S: Final = 3.0
"""Below the chart's probe timeoutSeconds (5), so the probe says why rather than being killed."""
BODY_CHARS: Final = 300
"""How much of a failed answer's body is shown: enough for the extender's reason."""


def probe(url: str, *, timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    """GET ``url``: (ok, one line that says what happened)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return True, f"{url}: HTTP {answer.status}"
    except urllib.error.HTTPError as exc:
        body = exc.read(BODY_CHARS).decode("utf-8", "replace")
        return False, _one_line(f"{url}: HTTP {exc.code}: {body}")
    except urllib.error.URLError as exc:
        return False, _one_line(f"{url}: not answering: {exc.reason}")
    except (OSError, ValueError) as exc:
        return False, _one_line(f"{url}: {exc}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m metagpu.probe URL", file=sys.stderr)
        return 2
    ok, line = probe(args[0])
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
