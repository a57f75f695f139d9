"""How the extender gets an API client: handed in by the umbrella (plugin never imports certs)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

ApiOpener: TypeAlias = Callable[[Path | None], "AbstractAsyncContextManager[tuple[ApiClient, str]]"]
"""Opens an API client (with this kubeconfig, or in-cluster), closed on exit;
yields ``(client, where the credentials came from)``."""
