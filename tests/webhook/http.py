"""A small AdmissionReview client for tests: posts over TLS, decodes the response and its patch."""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass
class HttpAnswer:
    status: int
    text: str

    @property
    def review(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.text)
        return data

    @property
    def response(self) -> dict[str, Any]:
        out: dict[str, Any] = self.review["response"]
        return out

    @property
    def patch(self) -> list[dict[str, Any]]:
        """The decoded JSON Patch; empty when the response carries none."""
        raw = self.response.get("patch")
        if raw is None:
            return []
        assert self.response["patchType"] == "JSONPatch"
        ops: list[dict[str, Any]] = json.loads(base64.b64decode(raw))
        return ops


@dataclass
class ReviewClient:
    session: aiohttp.ClientSession
    url: str
    ssl_context: ssl.SSLContext

    async def post(
        self,
        body: bytes | dict[str, Any],
        *,
        path: str = "/mutate",
        content_type: str | None = "application/json",
        headers: dict[str, str] | None = None,
    ) -> HttpAnswer:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        sent = dict(headers or {})
        if content_type is not None:
            sent["Content-Type"] = content_type
        async with self.session.post(
            self.url + path, data=data, headers=sent, ssl=self.ssl_context
        ) as r:
            return HttpAnswer(r.status, await r.text())

    async def get(self, path: str) -> HttpAnswer:
        async with self.session.get(self.url + path, ssl=self.ssl_context) as r:
            return HttpAnswer(r.status, await r.text())
