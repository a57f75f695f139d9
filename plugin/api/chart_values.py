"""Which Helm chart value sets which config key, for messages an operator acts on.

The device plugin and the agent read a config file; in a cluster the chart
renders it, and an operator changes it through chart values, never the file.
A crash that said "fail_on_init_error is true; set it to false" sent operators
looking for a key they cannot set directly: ``--set plugin.failOnInitError=false``
is what works. :func:`setting` names both. The chart tests check every pair
here against the rendered config, so a renamed value fails a test, not an
operator.
"""

from __future__ import annotations

from typing import Final

CHART_VALUES: Final[dict[str, str]] = {
    "fail_on_init_error": "plugin.failOnInitError",
    "resources[].gpus": "plugin.resourceGpus",
    "placement.honour_assignments": "plugin.honourAssignments",
    "gpus_file": "plugin.simulatedGpus",
    "health.enabled": "plugin.healthChecks",
    "agent.memory_enforcement": "agent.memoryEnforcement",
    "agent.socket_dir": "agent.socketDir",
}
"""Config key (dotted, as in the file) → the chart value that renders it."""

HOST_PATH_VALUES: Final[dict[str, str]] = {
    "device_plugins_dir": "plugin.devicePluginsDir",
}
"""Config keys the chart fixes to an in-container path, mounting the host
directory that the chart value names there: the value is what to change."""


def setting(key: str) -> str:
    """``key`` as an operator can change it: ``fail_on_init_error (chart value
    plugin.failOnInitError)``; just ``key`` when no chart value sets it."""
    if key in CHART_VALUES:
        return f"{key} (chart value {CHART_VALUES[key]})"
    if key in HOST_PATH_VALUES:
        return f"{key} (in the chart, the host path value {HOST_PATH_VALUES[key]})"
    return key
