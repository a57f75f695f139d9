"""Enter an image's root filesystem and exec its command as a container runtime would.

``python chroot_exec.py SPEC.json``, run by :class:`tests.image.containers.ChrootRunner`
inside a private mount namespace whose mounts it has already set up. Standard
library only (it runs with the host's Python, before the chroot): chroot, then
the capability bounding set cut to the spec's ``caps`` (so root keeps only
those after exec, and a non-root user gets none), supplementary groups cleared,
GID and UID set, no-new-privileges, and exec with the image's environment.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAPABILITIES = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "DAC_READ_SEARCH": 2,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "SETPCAP": 8,
    "NET_BIND_SERVICE": 10,
    "NET_RAW": 13,
    "SYS_CHROOT": 18,
    "SYS_PTRACE": 19,
    "SYS_ADMIN": 21,
    "SYS_RESOURCE": 24,
    "MKNOD": 27,
    "AUDIT_WRITE": 29,
    "SETFCAP": 31,
}


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    libc = ctypes.CDLL(None, use_errno=True)
    keep = set()
    for name in spec["caps"]:
        if name.upper() not in CAPABILITIES:
            sys.exit(f"chroot_exec: unknown capability {name!r}; known: {sorted(CAPABILITIES)}")
        keep.add(CAPABILITIES[name.upper()])
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    os.chroot(spec["root"])
    os.chdir("/")
    for cap in range(last + 1):
        if cap not in keep and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            sys.exit(
                f"chroot_exec: cannot drop capability {cap}: {os.strerror(ctypes.get_errno())}"
            )
    os.setgroups([])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    if spec["no_new_privs"] and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.exit(f"chroot_exec: cannot set no_new_privs: {os.strerror(ctypes.get_errno())}")
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])


if __name__ == "__main__":
    main(sys.argv[1])
