"""HTTP-level property: whatever is posted to ``/mutate``, the answer is a 200 or a 400, never 5xx.

The webhook runs on its own event loop in a thread (module-scoped: started
once), and hypothesis drives a plain blocking HTTPS client that trusts only
the test CA, so the generated examples need no event loop of their own.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from certs.files import BundlePaths
from tests.webhook.conftest import client_context, webhook_config
from tests.webhook.strategies import pod
from webhook.server import RunningWebhook, running_webhook


class ThreadedWebhook:
    """``running_webhook`` on an event loop in a background thread."""

    def __init__(self, bundle: BundlePaths) -> None:
        self._config = webhook_config(bundle)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.hook: RunningWebhook | None = None
        self.error: BaseException | None = None

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with running_webhook(self._config) as hook:
                self.hook = hook
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self.error = exc
            self._ready.set()
            raise

    def __enter__(self) -> RunningWebhook:
        self._thread.start()
        assert self._ready.wait(30), "webhook thread did not start"
        if self.error is not None:
            raise self.error
        assert self.hook is not None
        return self.hook

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


class BlockingClient:
    """http.client over TLS with keep-alive; reconnects if the server closed the connection."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        self._port, self._ctx = port, ctx
        self._conn = self._connect()

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self._port, context=self._ctx, timeout=30)

    def post(self, body: bytes, content_type: str | None) -> tuple[int, bytes]:
        headers = {"Content-Type": content_type} if content_type else {}
        for attempt in (1, 2):
            try:
                self._conn.request("POST", "/mutate", body=body, headers=headers)
                response = self._conn.getresponse()
                data = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self._conn.close()
                    self._conn = self._connect()
                return response.status, data
            except (http.client.RemoteDisconnected, ConnectionError, http.client.BadStatusLine):
                self._conn.close()
                self._conn = self._connect()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._conn.close()


@pytest.fixture(scope="module")
def blocking_client(ca_bundle: BundlePaths) -> Iterator[BlockingClient]:
    with ThreadedWebhook(ca_bundle) as hook:
        client = BlockingClient(hook.port, client_context(ca_bundle.ca_file))
        yield client
        client.close()


KINDS = [
    {"group": "", "version": "v1", "kind": "Pod"},
    {"group": "apps", "version": "v1", "kind": "Deployment"},
    {"group": "batch", "version": "v1", "kind": "CronJob"},
    {"group": "", "version": "v1", "kind": "ConfigMap"},
]


@st.composite
def review(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(KINDS))
    obj: dict[str, Any] = draw(pod())
    if kind["kind"] == "Deployment":
        obj = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": obj}}
    elif kind["kind"] == "CronJob":
        obj = {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "spec": {"jobTemplate": {"spec": {"template": obj}}},
        }
    request: dict[str, Any] = {
        "uid": draw(st.uuids()).hex,
        "kind": kind,
        "resource": {
            "group": kind["group"],
            "version": "v1",
            "resource": kind["kind"].lower() + "s",
        },
        "namespace": "team-a",
        "operation": draw(st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT"])),
        "object": obj,
        "oldObject": copy.deepcopy(obj) if draw(st.booleans()) else None,
        "dryRun": draw(st.sampled_from([False, True, None])),
    }
    if draw(st.booleans()):
        request["subResource"] = draw(st.sampled_from(["ephemeralcontainers", "status", "scale"]))
    data: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    }
    # break the envelope now and then
    vandal = draw(st.sampled_from(["none"] * 6 + ["drop", "retype"]))
    if vandal != "none":
        target = draw(st.sampled_from([data, request]))
        key = draw(st.sampled_from(sorted(target)))
        if vandal == "drop":
            del target[key]
        else:
            target[key] = draw(
                st.one_of(st.integers(), st.text(max_size=3), st.lists(st.none(), max_size=1))
            )
    return data


bodies = st.one_of(
    review().map(lambda r: (json.dumps(r).encode(), "application/json")),
    review().map(lambda r: (json.dumps(r).encode(), "application/json; charset=utf-8")),
    st.tuples(st.binary(max_size=200), st.sampled_from(["application/json", "text/plain", None])),
    st.tuples(
        st.recursive(
            st.none() | st.integers() | st.text(max_size=5),
            lambda c: st.lists(c) | st.dictionaries(st.text(max_size=3), c),
            max_leaves=10,
        ).map(lambda v: json.dumps(v).encode()),
        st.just("application/json"),
    ),
)


@pytest.mark.slow
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=bodies)
def test_mutate_never_answers_5xx(
    blocking_client: BlockingClient, case: tuple[bytes, str | None]
) -> None:
    body, content_type = case
    status, data = blocking_client.post(body, content_type)
    note(f"{status}: {data[:300]!r}")
    assert status in (200, 400)
    if status == 400:
        assert data.strip()  # a message, not an empty 400
        return
    answer = json.loads(data)["response"]
    sent = json.loads(body)
    assert answer["uid"] == sent["request"]["uid"]
    if answer["allowed"] and "patch" in answer:
        ops = json.loads(base64.b64decode(answer["patch"]))
        jsonpatch.apply_patch(sent["request"]["object"], ops)
    if not answer["allowed"]:
        assert answer["status"]["message"]
