"""The device plugin DaemonSet: where it runs, what it mounts, and which privileges it has."""

from __future__ import annotations

import pytest

from tests.install.chart import Mode, Obj, component, container, find, mode_params, one, render


def daemonset(values: Obj | None = None) -> Obj:
    return component(render(values), "DaemonSet", "plugin")


def pod(values: Obj | None = None) -> Obj:
    spec: Obj = daemonset(values)["spec"]["template"]["spec"]
    return spec


def test_runs_on_labelled_gpu_nodes_despite_their_taints() -> None:
    spec = pod()
    assert spec["nodeSelector"] == {"accelerator": "nvidia"}
    tolerations = spec["tolerations"]
    assert {
        "key": "cnvrg.io/metagpu",
        "operator": "Equal",
        "value": "present",
        "effect": "NoSchedule",
    } in tolerations
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in tolerations
    assert len(tolerations) == len({str(sorted(t.items())) for t in tolerations}), "duplicates"


def test_scheduling_values() -> None:
    ds = daemonset()
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["hostPID"] is True
    assert spec["enableServiceLinks"] is False
    assert "hostNetwork" not in spec
    assert "hostIPC" not in spec
    # Helm merges maps with the defaults; null removes a default key.
    custom = pod(
        {"plugin": {"nodeSelector": {"accelerator": None, "gpu": "a100"}, "priorityClassName": ""}}
    )
    assert custom["nodeSelector"] == {"gpu": "a100"}
    assert "priorityClassName" not in custom


def test_containers_see_every_gpu_through_nvml_only() -> None:
    spec = pod()
    for name in ("device-plugin", "agent"):
        env = {e["name"]: e.get("value") for e in container(spec, name)["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_host_paths() -> None:
    volumes = {v["name"]: v.get("hostPath") for v in pod()["volumes"]}
    assert volumes["device-plugins"] == {
        "path": "/var/lib/kubelet/device-plugins",
        "type": "Directory",
    }
    assert volumes["pod-resources"] == {
        "path": "/var/lib/kubelet/pod-resources",
        "type": "Directory",
    }
    assert volumes["agent-socket-dir"] == {"path": "/var/run/metagpu", "type": "DirectoryOrCreate"}
    assert volumes["config"] is None  # a ConfigMap


@pytest.mark.parametrize("enforcement", ["off", "report", "kill"])
def test_privileges_are_the_minimum_for_each_container(enforcement: str) -> None:
    spec = pod({"agent": {"memoryEnforcement": enforcement}})
    for c in spec["containers"]:
        security = c["securityContext"]
        assert security.get("privileged") is not True, c["name"]
        assert security["allowPrivilegeEscalation"] is False, c["name"]
        assert security["capabilities"]["drop"] == ["ALL"], c["name"]
        assert security["runAsUser"] == 0, f"{c['name']} writes root-owned kubelet directories"
    # mgctl kill works in every mode, and signalling another UID needs CAP_KILL.
    assert container(spec, "agent")["securityContext"]["capabilities"]["add"] == ["KILL"]
    for name in ("device-plugin", "mps-control-daemon"):
        if any(c["name"] == name for c in spec["containers"]):
            assert "add" not in container(spec, name)["securityContext"]["capabilities"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("mode", mode_params())
def test_mps_adds_the_pipe_directory_and_control_daemon(mode: Mode) -> None:
    spec = pod(mode.values())
    names = [c["name"] for c in spec["containers"]]
    volumes = {v["name"]: v for v in spec["volumes"]}
    if mode.mps:
        assert names == ["device-plugin", "agent", "mps-control-daemon"]
        assert volumes["mps-pipes"]["hostPath"] == {
            "path": "/var/run/metagpu-mps",
            "type": "DirectoryOrCreate",
        }
        daemon = container(spec, "mps-control-daemon")
        assert daemon["command"] == ["nvidia-cuda-mps-control"]
        assert daemon["args"] == ["-f"]
        env = {e["name"]: e["value"] for e in daemon["env"]}
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/var/run/metagpu-mps"
        assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
        assert {"name": "mps-pipes", "mountPath": "/var/run/metagpu-mps"} in daemon["volumeMounts"]
    else:
        assert names == ["device-plugin", "agent"]
        assert "mps-pipes" not in volumes
    if mode.ocp:
        assert spec["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    else:
        assert "seLinuxOptions" not in spec["securityContext"]


def test_mps_without_the_chart_daemon() -> None:
    spec = pod({"mps": {"enabled": True, "controlDaemon": {"enabled": False}}})
    assert [c["name"] for c in spec["containers"]] == ["device-plugin", "agent"]
    assert any(v["name"] == "mps-pipes" for v in spec["volumes"])


def test_runtime_class_is_created_only_on_request() -> None:
    assert not find(render(), "RuntimeClass")
    runtime_class = one(
        render({"runtimeClass": {"create": True, "handler": "nvidia-cdi"}}), "RuntimeClass"
    )
    assert runtime_class["metadata"]["name"] == "nvidia"
    assert runtime_class["handler"] == "nvidia-cdi"
    assert runtime_class["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


@pytest.mark.parametrize("read_only", [False, True])
def test_read_only_root_filesystem_is_a_choice(read_only: bool) -> None:
    spec = pod({"plugin": {"readOnlyRootFilesystem": read_only}, "mps": {"enabled": True}})
    for c in spec["containers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is read_only, c["name"]


def test_resources_are_set_for_every_container() -> None:
    for c in pod({"mps": {"enabled": True}})["containers"]:
        assert c["resources"]["requests"], c["name"]
        assert c["resources"]["limits"]["memory"], c["name"]
