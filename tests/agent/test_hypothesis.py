"""Property tests for the agent's pure code (kept apart, as yarl does)."""

from __future__ import annotations

import json

import yaml
from hypothesis import example, given, note
from hypothesis import strategies as st

from plugin.agent.accounting import Allocation, build_snapshot
from plugin.agent.cgroups import CgroupFormatError, parse_cgroup_file, pick_container
from plugin.agent.containers import PodIndex
from plugin.agent.labels import LABEL_VALUE_MAX, label_value
from plugin.agent.mgctl import to_yaml
from tests.agent.builders import gpu, gpu_uuid, key, reading

HEX = "0123456789abcdef"
container_ids = st.text(alphabet=HEX, min_size=64, max_size=64)
uids = st.uuids().map(str)
qos = st.sampled_from(["", "besteffort", "burstable"])


@st.composite
def kube_cgroup_paths(draw: st.DrawFn) -> tuple[str, str, str]:
    """A container's cgroup path in one of the runtimes' shapes: (path, id, pod uid)."""
    cid, uid, level = draw(container_ids), draw(uids), draw(qos)
    uid_ = uid.replace("-", "_")
    prefix = draw(st.sampled_from(["", "/system.slice/docker-" + "a" * 64 + ".scope", "/../.."]))
    shape = draw(st.sampled_from(["cgroupfs", "systemd", "crio-cgroupfs"]))
    if shape == "cgroupfs":
        path = "/kubepods" + (f"/{level}" if level else "") + f"/pod{uid}/{cid}"
    elif shape == "crio-cgroupfs":
        path = "/kubepods" + (f"/{level}" if level else "") + f"/pod{uid}/crio-{cid}"
    else:
        runtime = draw(st.sampled_from(["cri-containerd", "crio", "docker"]))
        qos_slice = f"/kubepods-{level}.slice" if level else ""
        pod_slice = f"kubepods-{level}-pod{uid_}.slice" if level else f"kubepods-pod{uid_}.slice"
        path = f"/kubepods.slice{qos_slice}/{pod_slice}/{runtime}-{cid}.scope"
    return prefix + path, cid, uid


@given(kube_cgroup_paths(), st.booleans())
def test_every_runtime_shape_names_its_container(sample: tuple[str, str, str], v1: bool) -> None:
    path, cid, uid = sample
    text = f"12:memory:{path}\n1:name=systemd:{path}\n0::/\n" if v1 else f"0::{path}\n"
    note(text)
    parsed = parse_cgroup_file(text)
    assert pick_container(parsed, known=lambda _: False) == cid
    assert parsed.pod_uid == uid


@given(st.text(max_size=300))
@example("0::\n")
@example("1:memory\n")
@example("0::/kubepods/pod/" + "a" * 64)
def test_parsing_never_fails_with_anything_but_a_format_error(text: str) -> None:
    try:
        parsed = parse_cgroup_file(text)
    except CgroupFormatError:
        return
    assert all(len(c) == 64 for c in parsed.candidates)


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 60), st.sampled_from("abcdef")),
        max_size=12,
    )
)
def test_a_gpu_never_hands_out_more_than_it_has(requests: list[tuple[int, int, str]]) -> None:
    """Whatever the kubelet reports (even overlapping or oversized grants), per GPU:
    allocated counts every unit, free is never negative, limits sum to what was granted."""
    next_unit = [0, 0, 0, 0]
    allocations = []
    for gpu_index, n, pod_name in requests:
        start = next_unit[gpu_index]
        next_unit[gpu_index] += n
        allocations.append(
            Allocation(
                key(pod_name),
                "r",
                tuple(f"{gpu_uuid(gpu_index)}::{u}" for u in range(start, start + n)),
            )
        )
    snap = build_snapshot(
        [reading(gpu(i)) for i in range(4)],
        allocations,
        {},
        directory=PodIndex(),
        units_per_gpu=100,
        gpu_resources={gpu_uuid(i): "r" for i in range(4)},
        resources=["r"],
        taken_at=0,
    )
    for g in snap.gpus:
        assert g.units_allocated == next_unit[g.index]
        assert g.units_free == max(0, 100 - next_unit[g.index])
        shares = [s for s in snap.shares if s.gpu_uuid == g.uuid]
        assert sum(s.units for s in shares) == g.units_allocated
        assert sum(
            s.memory_limit_mib for s in shares
        ) <= g.units_allocated * g.memory_total_mib // 100 + len(shares)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=10), json_values, max_size=5))
@example({"a": "yes", "b": "1.5", "c": "", "d": "- x", "e": "null", "f": "#", "g": "a: b"})
@example({"items": [{"x": [1, [2, {}]], "y": []}], "": {"": None}})
@example({"A\n": "trailing\n", "x": "a\nb"})
@example({"big": 1e16, "small": 1e-7, "tiny": 5e-324, "neg": -2.5e300, "int": 2**60})
def test_yaml_emitter_round_trips(doc: dict[str, object]) -> None:
    text = to_yaml(doc)
    note(text)
    assert yaml.safe_load(text) == json.loads(json.dumps(doc))


@given(st.text(max_size=100))
def test_label_values_are_always_valid(text: str) -> None:
    value = label_value(text)
    assert len(value) <= LABEL_VALUE_MAX
    assert value == "" or (value[0].isalnum() and value[-1].isalnum())
    assert all(c.isascii() and (c.isalnum() or c in "-_.") for c in value)
