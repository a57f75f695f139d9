"""``metagpu dra-plugin``: the DRA kubelet plugin, with the credentials every component uses.

No module of plugin may import certs, so the umbrella hands in
:func:`certs.kube.open_api_client`, as it does for the device plugin
(:mod:`metagpu.device_plugin`).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Final

from plugin.dra.cli import dra_plugin_command

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient


def open_api_client() -> AbstractAsyncContextManager[tuple[ApiClient, str]]:
    """:func:`certs.kube.open_api_client`, imported when the plugin runs, not for ``--help``."""
    from certs.kube import open_api_client as open_client  # noqa: PLC0415 - kubernetes-asyncio

    return open_client()


COMMANDS: Final = (dra_plugin_command(open_api=open_api_client),)
