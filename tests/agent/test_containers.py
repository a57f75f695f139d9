"""The pod index: container IDs of regular, init and ephemeral containers → pods."""

from __future__ import annotations

from plugin.agent.cgroups import ContainerId
from plugin.agent.containers import ContainerKey, PodIndex, containers_of_pod
from tests.agent.builders import container_id, pod, ref


def test_every_kind_of_container_is_indexed() -> None:
    p = pod("a", containers=("main", "sidecar"), init=("setup",))
    p["status"]["ephemeralContainerStatuses"] = [
        {"name": "debug", "containerID": f"cri-o://{container_id('ml/a/debug')}"}
    ]
    got = {(c.key.container, c.kind) for c in containers_of_pod(p)}
    assert got == {
        ("main", "container"),
        ("sidecar", "container"),
        ("setup", "init"),
        ("debug", "ephemeral"),
    }


def test_not_started_containers_are_skipped() -> None:
    p = pod("a")
    p["status"]["containerStatuses"][0]["containerID"] = ""
    assert list(containers_of_pod(p)) == []


def test_index_follows_events() -> None:
    index = PodIndex()
    index.replace([pod("a")])
    assert index.lookup(ref("a").container_id) == ref("a")
    assert index.by_key(ContainerKey("ml", "a", "main")) == ref("a")
    gen = index.generation

    restarted = pod("a")
    new_id = container_id("restarted")
    restarted["status"]["containerStatuses"][0]["containerID"] = f"containerd://{new_id}"
    index.apply("MODIFIED", restarted)
    assert index.generation > gen
    assert index.lookup(ref("a").container_id) is None  # the old container is gone
    assert index.lookup(new_id) is not None

    index.apply("DELETED", restarted)
    assert index.lookup(new_id) is None
    assert index.pod("ml", "a") is None
    assert not index.knows(ContainerId(new_id))
    assert len(index) == 0


def test_bookmarks_and_unknown_events_change_nothing() -> None:
    index = PodIndex()
    index.replace([pod("a")])
    gen = index.generation
    index.apply("BOOKMARK", {"metadata": {"resourceVersion": "5"}})
    assert index.generation == gen
    assert len(index) == 1
