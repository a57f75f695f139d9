"""DRA shares, read back from node-local truth: a container's claim devices to shares.

On a node served by the DRA kubelet plugin (``metagpu dra-plugin``) the kubelet's
PodResources ``List`` names, per container, the devices of its ResourceClaims
(``dynamic_resources``: claim, then ``ClaimResource{cdi_devices, driver_name,
pool_name, device_name}``). The device is the GPU (``gpu-0``); how much of it the
container holds is not in that answer. It is in the CDI spec the DRA plugin wrote
when it prepared the share, and the CDI device ID the kubelet lists names that spec's
device. So the agent joins the two, both on this node, and needs no API server:

* **ID**: ``<driver>/gpu=<name>`` (``plugin.dra.cdi.cdi_device_id``); the name is the
  share's ``shareID`` or ``<claim UID>-<device>``, unique on the node.
* **Files**: one spec per share in ``cdi_dir`` named ``<driver>-gpu_<claim UID>_<key>.json``
  (``plugin.dra.cdi.spec_file_name``). The claim UID is not in PodResources, so the
  agent reads every file with the ``<driver>-gpu_`` prefix and indexes them by the
  devices they define, as a runtime's CDI registry does (``kind`` + ``devices[].name``).
* **Content** (``plugin.dra.cdi.build_spec``): ``kind: <driver>/gpu`` and, per device,
  ``containerEdits.env`` with ``NVIDIA_VISIBLE_DEVICES=<GPU UUID>``,
  ``METAGPU_UNITS=<units>``, ``METAGPU_MEMORY_LIMIT_MB=<MiB>`` and, optionally,
  ``METAGPU_COMPUTE_POLICY``. Those values are what the container was told, so the
  agent shows and enforces exactly them. ``tests/agent/test_dra_shares.py`` reads specs
  the DRA plugin's own Preparer wrote, so the two cannot drift apart silently.

The result is :class:`~plugin.agent.accounting.Allocation` values with
:class:`~plugin.agent.accounting.ShareGrant` entries: the one type the accounting join
already takes, so metrics, enforcement and mgctl treat a DRA share as any other. A
claim device that cannot be resolved (no spec file, a bad one, no CDI device listed)
becomes an :class:`~plugin.agent.accounting.UnresolvedShare` with its reason; nothing
here raises for a bad input.

Bounded: spec files are re-read only when their (mtime, size) changed, the cache holds
only files present at the last scan, and at most :data:`MAX_SPEC_FILES` files of at
most :data:`MAX_SPEC_BYTES` each are read. The agent must not import ``plugin.dra``
(an import contract); the format above is the contract between them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from plugin.agent.accounting import Allocation, ShareGrant, UnresolvedShare
from plugin.agent.containers import ContainerKey
from plugin.api.cdi_names import cdi_kind, driver_spec_prefix
from plugin.api.resources import (
    ENV_COMPUTE_POLICY,
    ENV_MEMORY_LIMIT_MB,
    ENV_NVIDIA_VISIBLE_DEVICES,
    ENV_UNITS,
)

logger = logging.getLogger(__name__)

MAX_SPEC_FILES: Final = 4096
"""Spec files read per scan. A node runs a few hundred pods at most (110 by default),
each share one file; past this the rest are reported, not read."""
MAX_SPEC_BYTES: Final = 256 * 1024
"""A share's spec is under 2 KiB; a bigger file is not one the plugin wrote."""


class CdiSpecError(ValueError):
    """A spec file that is not what the DRA plugin writes; the message says what."""


@dataclass(frozen=True)
class SpecShare:
    """One device of a spec file: a share as the DRA plugin prepared it."""

    device_id: str
    """``<driver>/gpu=<name>``, as the kubelet lists it."""
    gpu_uuid: str
    units: int
    memory_limit_mib: int
    compute_policy: str
    file: str


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a container's claim, as the kubelet reports it (``ClaimResource``)."""

    key: ContainerKey
    claim: str
    """``namespace/name`` of the ResourceClaim."""
    driver: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


def shares_of_spec(doc: Any, *, kind: str, file: str) -> tuple[SpecShare, ...]:
    """The shares one spec file defines. Raises :class:`CdiSpecError` with the reason."""
    if not isinstance(doc, Mapping):
        raise CdiSpecError("not a JSON object")
    if doc.get("kind") != kind:
        raise CdiSpecError(f"kind is {doc.get('kind')!r}, not {kind!r}")
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        raise CdiSpecError("no devices")
    shares: list[SpecShare] = []
    for device in devices:
        name = device.get("name") if isinstance(device, Mapping) else None
        if not isinstance(name, str) or not name:
            raise CdiSpecError("a device has no name")
        env = _env_of(device)
        gpu = env.get(ENV_NVIDIA_VISIBLE_DEVICES, "")
        if not gpu or "," in gpu:
            raise CdiSpecError(f"device {name}: {ENV_NVIDIA_VISIBLE_DEVICES} is not one GPU")
        shares.append(
            SpecShare(
                device_id=f"{kind}={name}",
                gpu_uuid=gpu,
                units=_count(env, ENV_UNITS, name),
                memory_limit_mib=_count(env, ENV_MEMORY_LIMIT_MB, name),
                compute_policy=env.get(ENV_COMPUTE_POLICY, ""),
                file=file,
            )
        )
    return tuple(shares)


def _env_of(device: Mapping[str, Any]) -> dict[str, str]:
    edits = device.get("containerEdits")
    entries = edits.get("env") if isinstance(edits, Mapping) else None
    env: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, str) and "=" in entry:
            name, value = entry.split("=", 1)
            env[name] = value  # the last one wins, as in a container
    return env


def _count(env: Mapping[str, str], name: str, device: str) -> int:
    raw = env.get(name)
    if raw is None or not raw.isdigit():
        raise CdiSpecError(f"device {device}: {name} is {raw!r}, not a whole number")
    return int(raw)


def allocations_of_claims(
    devices: Iterable[ClaimDevice],
    specs: Mapping[str, SpecShare | str],
    *,
    driver: str,
    missing: str,
) -> tuple[Allocation, ...]:
    """One :class:`Allocation` (resource ``driver``) per container holding claims of ours.

    ``specs`` maps CDI device IDs to their share, or to why that ID cannot be read
    (a bad file); an ID missing from it gets ``missing`` as its reason. Each ID counts
    once per container: the kubelet builds the ``cdi_devices`` of a driver's devices in
    one claim cumulatively (``GetDynamicResources`` in
    ``pkg/kubelet/cm/container_manager_linux.go`` appends to one list across the
    devices), so a later device also lists the earlier ones' IDs. CDI IDs of other
    kinds (``extra_cdi_device``, e.g. ``nvidia.com/gpu=<uuid>``) are not shares."""
    kind = cdi_kind(driver)
    grants: dict[ContainerKey, dict[str, ShareGrant]] = {}
    unresolved: dict[ContainerKey, list[UnresolvedShare]] = {}
    for claim_device in devices:
        if claim_device.driver != driver:
            continue
        key = claim_device.key
        mine = grants.setdefault(key, {})
        problems = unresolved.setdefault(key, [])
        ours = [i for i in claim_device.cdi_ids if i.startswith(f"{kind}=")]
        if not ours:
            problems.append(
                UnresolvedShare(
                    key,
                    claim_device.claim,
                    f"{claim_device.pool}/{claim_device.device}",
                    f"the kubelet lists no CDI device of kind {kind} for it",
                )
            )
            continue
        for device_id in ours:
            if device_id in mine or any(u.device == device_id for u in problems):
                continue
            found = specs.get(device_id, missing)
            if isinstance(found, str):
                problems.append(UnresolvedShare(key, claim_device.claim, device_id, found))
                continue
            mine[device_id] = ShareGrant(
                gpu_id=found.gpu_uuid,
                share=device_id,
                claim=claim_device.claim,
                units=found.units,
                memory_limit_mib=found.memory_limit_mib,
                compute_policy=found.compute_policy,
            )
    return tuple(
        Allocation(
            key=key,
            resource=driver,
            device_ids=(),
            grants=tuple(grants[key].values()),
            unresolved=tuple(unresolved[key]),
        )
        for key in grants
    )


@dataclass
class _Cached:
    stamp: tuple[int, int]
    """(mtime in ns, size): re-read when either changed."""
    shares: tuple[SpecShare, ...]
    error: str | None


class DraShareReader:
    """The DRA plugin's spec files in ``cdi_dir``, turned into shares on demand.

    Blocking file reads: call :meth:`resolve` from a worker thread. Not thread-safe;
    one cycle at a time uses it."""

    def __init__(self, cdi_dir: Path, *, driver: str) -> None:
        self.cdi_dir = cdi_dir
        self.driver = driver
        self._kind = cdi_kind(driver)
        self._cache: dict[str, _Cached] = {}

    def resolve(self, devices: Iterable[ClaimDevice]) -> tuple[Allocation, ...]:
        """The containers' claim devices as allocations (reasons for those that fail)."""
        specs, missing = self._scan()
        return allocations_of_claims(devices, specs, driver=self.driver, missing=missing)

    def _scan(self) -> tuple[dict[str, SpecShare | str], str]:
        """CDI device ID → share or reason, and the reason for an ID no file defines."""
        prefix = driver_spec_prefix(self.driver)
        missing = (
            f"no CDI spec in {self.cdi_dir} defines it (the DRA plugin writes one per "
            "prepared share; was the claim unprepared, or is the plugin's cdi_dir "
            "another directory?)"
        )
        try:
            with os.scandir(self.cdi_dir) as entries:
                names = sorted(
                    e.name
                    for e in entries
                    if e.name.startswith(prefix) and e.name.endswith(".json")
                )
        except FileNotFoundError:
            self._cache.clear()
            return {}, (
                f"{self.cdi_dir} does not exist: mount the host's CDI spec directory "
                "(the DRA plugin's cdi_dir) into the agent container"
            )
        except OSError as exc:
            self._cache.clear()
            return {}, f"cannot list {self.cdi_dir}: {exc}"
        if len(names) > MAX_SPEC_FILES:
            missing += f"; {len(names)} spec files, only the first {MAX_SPEC_FILES} were read"
            names = names[:MAX_SPEC_FILES]
        cache = {name: self._read(name) for name in names}
        self._cache = cache  # drops files that are gone
        specs: dict[str, SpecShare | str] = {}
        bad = [c.error for c in cache.values() if c.error is not None]
        if bad:
            # Which devices a file defines is inside it: a share whose file cannot be
            # read is "missing", with the unreadable files named.
            missing += f"; {len(bad)} spec file(s) cannot be read, first: {bad[0]}"
        for name, cached in cache.items():
            if cached.error is not None:
                continue
            for share in cached.shares:
                other = specs.get(share.device_id)
                if other is None:
                    specs[share.device_id] = share
                else:
                    first = other.file if isinstance(other, SpecShare) else "another file"
                    # A CDI registry refuses a device two files define; so does the agent.
                    specs[share.device_id] = f"defined by two spec files: {first} and {name}"
        return specs, missing

    def _read(self, name: str) -> _Cached:
        path = self.cdi_dir / name
        try:
            st = path.stat()
        except OSError as exc:
            return _Cached((0, 0), (), f"cannot read {path}: {exc}")
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._cache.get(name)
        if cached is not None and cached.stamp == stamp:
            return cached
        try:
            if st.st_size > MAX_SPEC_BYTES:
                raise CdiSpecError(f"{st.st_size} bytes, more than a share's spec")
            doc = json.loads(path.read_bytes())
            shares = shares_of_spec(doc, kind=self._kind, file=name)
        except (OSError, ValueError) as exc:  # CdiSpecError and JSONDecodeError too
            logger.warning("unreadable CDI spec", extra={"file": str(path), "error": str(exc)})
            return _Cached(stamp, (), f"{path}: {exc}")
        return _Cached(stamp, shares, None)
