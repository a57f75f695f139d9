"""The kubelet's side of a DRA driver, for the DRA plugin's tests: the simulated kubelet
``metagpu dev --dra`` registers the plugin with (:mod:`metagpu.dra_kubelet_sim`)."""

from __future__ import annotations

from metagpu.dra_kubelet_sim import (
    CALL_TIMEOUT_S,
    KUBELET_VERSIONS,
    DraKubelet,
    DraKubeletSimError,
    HealthStream,
    RegistrationRefusedError,
)

__all__ = [
    "CALL_TIMEOUT_S",
    "KUBELET_VERSIONS",
    "DraKubelet",
    "DraKubeletSimError",
    "HealthStream",
    "RegistrationRefusedError",
]
