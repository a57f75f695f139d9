"""Which container runtimes apply CDI devices, from the version the kubelet reports."""

from __future__ import annotations

import pytest

from plugin.dra.cdi_runtime import cdi_verdict


@pytest.mark.parametrize(
    ("version", "support", "words"),
    [
        pytest.param("containerd://1.6.20", "unsupported", "no CDI support", id="captured"),
        pytest.param("containerd://1.7.13", "unknown", "enable_cdi = true", id="containerd-1.7"),
        pytest.param("containerd://v2.0.4", "supported", "applies CDI", id="containerd-2"),
        pytest.param("cri-o://1.22.5", "unsupported", "CRI-O >= 1.23", id="old-cri-o"),
        pytest.param("cri-o://1.31.0", "supported", "applies CDI", id="cri-o"),
        pytest.param("docker://24.0.7", "unknown", "not known", id="cri-dockerd"),
        pytest.param("containerd", "unknown", "unrecognised", id="garbage"),
        pytest.param(None, "unknown", "does not report", id="missing"),
    ],
)
def test_cdi_verdicts(version: str | None, support: str, words: str) -> None:
    verdict = cdi_verdict(version)
    assert verdict.support == support
    assert words in verdict.reason
    if version:
        assert version in verdict.reason
