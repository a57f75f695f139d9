"""The running DRA plugin sends the API server exactly the verbs it declares in
``plugin/dra/permissions.py``, which the chart grants (tests/install/test_dra_mode.py).

One run does everything that needs the API: the runtime check reads the Node, the
slice is published, replaced when someone changes it, and watched; a prepare reads
its claim.
"""

from __future__ import annotations

import pytest

from plugin.api.permissions import verb_set
from plugin.dra.permissions import PERMISSIONS
from tests.plugin.conftest import wait_until
from tests.plugin.dra.fixtures import load
from tests.plugin.dra.test_plugin import (  # noqa: F401 (fixtures)
    SLICE,
    Running,
    put_claim_of,
    running,
    runtime_version,
)


@pytest.mark.parametrize("runtime_version", ["containerd://2.1.0"])
async def test_the_plugin_uses_exactly_the_verbs_it_declares(running: Running) -> None:  # noqa: F811
    await wait_until(lambda: running.slice_devices() == ["gpu-0", "gpu-1"], what="the slice")
    # someone edits the slice: the plugin replaces it (update), never deletes it
    edited = running.fake.get("resource.k8s.io/v1", "ResourceSlice", SLICE)
    assert edited is not None
    edited["spec"]["devices"] = edited["spec"]["devices"][:1]
    running.fake.put(edited)
    await wait_until(
        lambda: any(r.verb == "update" for r in running.fake.writes()), what="the replace"
    )
    call = load("kubelet-node-prepare-consumable-50-units.json")
    put_claim_of(running.fake, call)
    await running.kubelet.register()
    await running.kubelet.replay(call)
    # a watch is recorded when it ends (the fixture's server-side timeout is 1 s)
    await wait_until(
        lambda: any(r.verb == "watch" for r in running.fake.requests), what="a watch recorded"
    )
    assert running.fake.verbs_used() == verb_set(PERMISSIONS)
