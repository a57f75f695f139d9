"""Adapter helpers shared by every plugin component that talks to the API server.

The node agent and the device plugin may not import each other (an
import-linter independence contract), yet both watch the pods of their node
and both get their client handed in by the ``metagpu`` umbrella. What they
share lives here.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeAlias

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

ApiOpener: TypeAlias = Callable[[], AbstractAsyncContextManager[tuple[client.ApiClient, str]]]
"""Opens an API client with loaded credentials, closed on exit; yields ``(client, source)``.

The shape of :func:`certs.kube.open_api_client` called with no arguments."""


def describe_api_error(exc: BaseException) -> str:
    """``403 Forbidden: nodes "n1" is forbidden: ...`` from an ApiException, else ``str()``."""
    if isinstance(exc, ApiException):
        message = exc.reason or ""
        body = exc.body
        if body:
            with contextlib.suppress(ValueError, AttributeError):
                message = json.loads(body).get("message", message)
        return f"{exc.status} {message}".strip()
    return f"{type(exc).__name__}: {exc}"
