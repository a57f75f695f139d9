"""Run the built image the way the chart runs it: a run spec read from the rendered chart,
and two ways to start it.

:func:`spec_from_chart` turns one rendered container (and its pod) into a
:class:`RunSpec`: user and group (container securityContext over the pod's),
read-only root, capabilities, no-new-privileges, and exactly the container's
volume mounts: an ``emptyDir`` becomes a tmpfs of its ``sizeLimit``, every
other volume a bind mount of a host directory the test fills the way the
kubelet would. Nothing is copied from the chart by hand.

Runners:

* :class:`PodmanRunner`: ``podman run`` with real namespaces (mount, PID, IPC,
  UTS; the host's network, so a client outside the container reaches the
  webhook on a port the test picked). ``--read-only-tmpfs=false``, so the root
  is read-only with no writable directories but the chart's.
* :class:`ChrootRunner`: where podman cannot start containers, the image's root
  filesystem (``buildah mount``) in a private mount namespace, bind-mounted
  read-only, entered with chroot (``tests/image/chroot_exec.py`` sets the
  user, group, capability bounding set and no-new-privileges). Host PID and
  network namespaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

Obj = dict[str, Any]

CHROOT_EXEC: Final = Path(__file__).with_name("chroot_exec.py")


@dataclass(frozen=True)
class Mount:
    """One of the container's mounts: a host directory, or a tmpfs (``source`` None)."""

    target: str
    source: Path | None
    read_only: bool
    size: str | None = None


@dataclass(frozen=True)
class RunSpec:
    """Everything about one container run that the chart decides, plus the test's args."""

    args: tuple[str, ...]
    user: int
    group: int
    read_only_root: bool
    cap_add: tuple[str, ...]
    no_new_privileges: bool
    mounts: tuple[Mount, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    entrypoint: str | None = None
    """Overrides the image's ENTRYPOINT (``mgctl``); None keeps ``metagpu``."""


class ChartSpecError(AssertionError):
    """The rendered chart asks for something this harness cannot reproduce."""


def _security(pod_spec: Obj, container: Obj) -> tuple[int, int, bool, tuple[str, ...], bool]:
    pod_sc: Obj = pod_spec.get("securityContext") or {}
    sc: Obj = container.get("securityContext") or {}
    user: int | None = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if user is None:
        raise ChartSpecError(f"container {container['name']} sets no runAsUser (pod or container)")
    group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    group = user if group is None else group
    caps: Obj = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        raise ChartSpecError(f"container {container['name']} does not drop ALL capabilities")
    return (
        int(user),
        int(group),
        bool(sc.get("readOnlyRootFilesystem", False)),
        tuple(caps.get("add") or ()),
        sc.get("allowPrivilegeEscalation") is False,
    )


def spec_from_chart(
    pod_spec: Obj,
    container_name: str,
    sources: Mapping[str, Path],
    *,
    extra_args: Sequence[str] = (),
    extra_mounts: Sequence[Mount] = (),
) -> RunSpec:
    """The run spec of ``container_name``; ``sources`` maps volume names to host directories.

    Every non-``emptyDir`` volume the container mounts needs a source: a
    missing one fails with the volume's name, rather than running without it.
    ``extra_args``/``extra_mounts`` are the test's own additions (simulated GPUs).
    """
    (container,) = [c for c in pod_spec["containers"] if c["name"] == container_name]
    user, group, read_only, cap_add, no_new_privs = _security(pod_spec, container)
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    mounts: list[Mount] = []
    for m in container.get("volumeMounts") or []:
        volume = volumes[m["name"]]
        if m.get("subPath"):
            raise ChartSpecError(f"volumeMount {m['name']} uses subPath, which is not reproduced")
        if "emptyDir" in volume:
            size = (volume["emptyDir"] or {}).get("sizeLimit")
            mounts.append(Mount(m["mountPath"], None, False, size))
            continue
        if m["name"] not in sources:
            raise ChartSpecError(
                f"no host directory for volume {m['name']!r} (mounted at {m['mountPath']}); "
                f"the test gives: {sorted(sources)}"
            )
        mounts.append(Mount(m["mountPath"], sources[m["name"]], bool(m.get("readOnly"))))
    env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    return RunSpec(
        args=(*container.get("args", ()), *extra_args),
        user=user,
        group=group,
        read_only_root=read_only,
        cap_add=cap_add,
        no_new_privileges=no_new_privs,
        mounts=(*mounts, *extra_mounts),
        env=env,
        entrypoint=container["command"][0] if container.get("command") else None,
    )


def project_volume(
    directory: Path, files: Mapping[str, str | bytes], *, mode: int, gid: int
) -> Path:
    """Fill ``directory`` like the kubelet fills a Secret/ConfigMap volume: root-owned files of
    ``mode`` (the volume's defaultMode), group ``gid`` (the pod's fsGroup, or 0)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, 0, gid)
    directory.chmod(0o755)
    for name, content in files.items():
        path = directory / name
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        os.chown(path, 0, gid)
        path.chmod(mode)
    return directory


# --------------------------------------------------------------------- runners
class Running(Protocol):
    """A started container."""

    def pid(self) -> int:
        """The host PID of its main process."""
        ...

    def alive(self) -> bool: ...

    def logs(self) -> str: ...

    def stop(self) -> None: ...


class Runner(Protocol):
    """Starts containers of one image; ``isolation`` says how, for the report."""

    @property
    def isolation(self) -> str: ...

    def start(self, spec: RunSpec) -> Running: ...

    def run(self, spec: RunSpec, *, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        """Run to completion; the result carries stdout, stderr and the exit code."""
        ...


LIMIT_CAP: Final = 32768
"""podman's default open-file and process limits are above what this kind of sandbox lets a
container runtime set (``setrlimit``: EPERM, e.g. 65536 processes); this one is accepted."""


def _limits() -> list[str]:
    """This process's own open-file and process limits, at most :data:`LIMIT_CAP`."""
    out: list[str] = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, _ = resource.getrlimit(limit)
        value = LIMIT_CAP if soft == resource.RLIM_INFINITY else min(soft, LIMIT_CAP)
        out += ["--ulimit", f"{name}={value}:{value}"]
    return out


@dataclass
class _PodmanContainer:
    name: str
    runner: PodmanRunner

    def _inspect(self, template: str) -> str:
        result = self.runner.podman("inspect", "--format", template, self.name, check=False)
        return result.stdout.strip()

    def pid(self) -> int:
        return int(self._inspect("{{.State.Pid}}") or 0)

    def alive(self) -> bool:
        return self._inspect("{{.State.Running}}") == "true"

    def logs(self) -> str:
        result = self.runner.podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after Kubernetes' default grace period (30 s), then remove.

        The device plugin exits within its health round (health.event_timeout_s, 1 s) after
        SIGTERM; the webhook drains for drainDelayS (5 s) first. A shorter wait than the
        kubelet's would end them by SIGKILL."""
        self.runner.podman("stop", "--time", "30", self.name, check=False, timeout_s=60)
        removed = self.runner.podman("rm", "--force", self.name, check=False)
        if removed.returncode != 0 and "no such container" not in removed.stderr.lower():
            raise RuntimeError(f"cannot remove container {self.name}: {removed.stderr}")


@dataclass
class PodmanRunner:
    """``podman run`` (or ``docker run``: ``cli``) with real namespaces; ``runtime`` picks
    podman's OCI runtime (None: its default)."""

    image: str
    runtime: str | None = None
    cli: str = "podman"

    @property
    def isolation(self) -> str:
        runtime = f", runtime {self.runtime}" if self.runtime else ""
        return f"{self.cli} run (real namespaces{runtime})"

    def podman(
        self, *args: str, check: bool = True, timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        runtime = ["--runtime", self.runtime] if self.runtime else []
        command = [self.cli, *runtime, *args]
        result = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=timeout_s
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed:\n{result.stderr}")
        return result

    def _run_args(self, spec: RunSpec, name: str) -> list[str]:
        args = ["--name", name, "--network", "host", "--user", f"{spec.user}:{spec.group}"]
        args += ["--cap-drop", "ALL", *(f"--cap-add={c}" for c in spec.cap_add)]
        if spec.read_only_root:
            # podman adds tmpfs on /tmp, /var/tmp and /run to a read-only root unless told not
            # to; docker adds none.
            args += ["--read-only"] + (["--read-only-tmpfs=false"] if self.cli == "podman" else [])
        if spec.no_new_privileges:
            args += ["--security-opt", "no-new-privileges"]
        args += _limits()
        for m in spec.mounts:
            if m.source is None:
                size = f",tmpfs-size={_bytes(m.size)}" if m.size else ""
                args += ["--mount", f"type=tmpfs,target={m.target}{size},tmpfs-mode=1777"]
            else:
                ro = ",ro=true" if m.read_only else ""
                args += ["--mount", f"type=bind,source={m.source},target={m.target}{ro}"]
        for key, value in spec.env.items():
            args += ["--env", f"{key}={value}"]
        if spec.entrypoint is not None:
            args += ["--entrypoint", spec.entrypoint]
        return [*args, self.image, *spec.args]

    def start(self, spec: RunSpec) -> _PodmanContainer:
        name = f"metagpu-smoke-{uuid.uuid4().hex[:8]}"
        self.podman("run", "--detach", *self._run_args(spec, name))
        return _PodmanContainer(name, self)

    def run(self, spec: RunSpec, *, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        name = f"metagpu-smoke-{uuid.uuid4().hex[:8]}"
        return self.podman(
            "run", "--rm", *self._run_args(spec, name), check=False, timeout_s=timeout_s
        )

    def works(self) -> bool:
        """Whether this runtime can start a container of the image here."""
        spec = RunSpec(("--version",), 65532, 65532, True, (), True, ())
        try:
            return self.run(spec, timeout_s=120).returncode == 0
        except (subprocess.TimeoutExpired, OSError):
            return False


def _bytes(size: str) -> int:
    """A Kubernetes quantity (16Mi) in bytes, for tmpfs sizes."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 1000, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if size.endswith(suffix):
            return int(size[: -len(suffix)]) * factor
    return int(size)


@dataclass
class _ChrootProcess:
    process: subprocess.Popen[bytes]
    log: Path

    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


@dataclass
class ChrootRunner:
    """The image's root filesystem from buildah, entered with chroot in a private mount
    namespace (host PID and network namespaces): for hosts where podman cannot run."""

    image: str
    root: Path
    env: Mapping[str, str]
    entrypoint: tuple[str, ...]
    isolation: str = "chroot (buildah mount, private mount namespace; host PID and network)"

    @classmethod
    @contextlib.contextmanager
    def of(cls, image: str) -> Iterator[ChrootRunner]:
        """Mount a working container of ``image``; removed again on exit."""
        ctr = _check(["buildah", "from", "--pull=never", "--quiet", image]).strip()
        try:
            root = Path(_check(["buildah", "mount", ctr]).strip())
            config = json.loads(_check(["buildah", "inspect", "--type", "container", ctr]))
            oci = config["OCIv1"]["config"]
            env = dict(item.split("=", 1) for item in oci.get("Env") or [])
            yield cls(image, root, env, tuple(oci.get("Entrypoint") or ()))
        finally:
            subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)

    def _command(self, spec: RunSpec, spec_file: Path) -> list[str]:
        """unshare (private mounts) -> sh (bind mounts, read-only root) -> chroot_exec."""
        root = shlex.quote(str(self.root))
        lines = [
            "set -e",
            f"mount --bind {root} {root}",
            f"mount --rbind /dev {root}/dev",
            f"mount -t proc proc {root}/proc",
        ]
        for m in spec.mounts:
            target = shlex.quote(str(self.inside(m.target)))
            lines.append(f"mkdir -p {target}")
            if m.source is None:
                size = f",size={_bytes(m.size)}" if m.size else ""
                lines.append(f"mount -t tmpfs -o mode=1777{size} tmpfs {target}")
            else:
                lines.append(f"mount --bind {shlex.quote(str(m.source))} {target}")
                if m.read_only:
                    lines.append(f"mount -o remount,bind,ro {target}")
        if spec.read_only_root:
            lines.append(f"mount -o remount,bind,ro {root}")
        lines.append(f"exec {shlex.quote(sys.executable)} {CHROOT_EXEC} {spec_file}")
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)]

    def inside(self, path: str) -> Path:
        """``path`` as the container sees it, on the host: symlinks resolved within the root
        (``/var/run -> /run`` must not lead to the host's /run), missing parts kept."""
        current = self.root
        parts = [p for p in Path(path).parts if p != "/"]
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                current = current.parent if current != self.root else current
                continue
            candidate = current / part
            if candidate.is_symlink():
                hops += 1
                if hops > 40:
                    raise RuntimeError(f"too many symlinks resolving {path} in {self.root}")
                link = os.readlink(candidate)
                if link.startswith("/"):
                    current = self.root
                parts = [p for p in Path(link).parts if p != "/"] + parts
                continue
            current = candidate
        return current

    def _spec_file(self, spec: RunSpec, directory: Path) -> Path:
        argv = [spec.entrypoint] if spec.entrypoint else list(self.entrypoint)
        data = {
            "root": str(self.root),
            "argv": [*argv, *spec.args],
            "env": {**self.env, **spec.env},
            "uid": spec.user,
            "gid": spec.group,
            "caps": list(spec.cap_add),
            "no_new_privs": spec.no_new_privileges,
        }
        path = directory / "spec.json"
        path.write_text(json.dumps(data))
        return path

    def start(self, spec: RunSpec) -> _ChrootProcess:
        directory = Path(tempfile.mkdtemp(prefix="mg-chroot-"))
        log = directory / "log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                self._command(spec, self._spec_file(spec, directory)),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return _ChrootProcess(process, log)

    def run(self, spec: RunSpec, *, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(prefix="mg-chroot-") as directory:
            return subprocess.run(
                self._command(spec, self._spec_file(spec, Path(directory))),
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout_s,
            )


def _check(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{result.stderr}")
    return result.stdout


def _namespaced(image: str, engine: str) -> Runner | None:
    if engine == "docker":
        return PodmanRunner(image, cli="docker")
    if shutil.which("podman") is None:
        return None
    for runtime in (None, "runc"):
        if runtime is not None and shutil.which(runtime) is None:
            continue
        runner = PodmanRunner(image, runtime=runtime)
        if runner.works():
            return runner
    return None


@contextlib.contextmanager
def choose_runner(image: str, engine: str, isolation: str) -> Iterator[Runner]:
    """The runner for ``image``: real namespaces (podman with its default OCI runtime, then
    runc: crun refuses hosts with a hybrid cgroup layout; or docker, when it built the image)
    unless ``isolation`` is ``chroot``; else chroot into ``buildah mount`` of the image."""
    found = None if isolation == "chroot" else _namespaced(image, engine)
    if found is not None:
        yield found
        return
    if isolation == "namespaces":
        raise RuntimeError("isolation 'namespaces': podman cannot start containers here")
    if shutil.which("buildah") is None:
        raise RuntimeError("neither podman nor buildah can run the image here (install buildah)")
    with ChrootRunner.of(image) as chroot:
        yield chroot
