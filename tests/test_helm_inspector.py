"""The Helm chart's `inspector` values (deploy/helm/netmon): off by default; on, the DaemonSet
mounts the node's directory read-write at the same path and netmon.yaml reads it there, as
netmon itself validates it; and what the chart refuses, it refuses by name. Rendered offline by
Helm's Go SDK through tests/test_helm_values.py's helpers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from netmon.config import load_config
from tests.test_helm import CHART, netmon_yaml
from tests.test_helm_values import (
    DEFAULTS,
    check_objects,
    lint,
    netmon_container,
    pod_spec,
    render,
)

HOST_PATH = "/var/lib/nccl-inspector"  # below a root inspector.dir allows
# Each kind of value netmon reads: durations as text and as seconds, a count, a size in bytes
# (a number Helm holds as a float64, which must not come out as 4.194304e+06).
SETTINGS: dict[str, Any] = {
    "interval": "1m",
    "window": "5m",
    "grace": 300,
    "stale_after": "2h",
    "max_shapes": 8,
    "max_read_bytes": 4194304,
}
ON: dict[str, Any] = {"inspector": {"enabled": True, "hostPath": HOST_PATH, "settings": SETTINGS}}
SECTION = "NCCL Inspector: the jobs' own collectives"


def _host_path_volumes(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v["hostPath"] for v in pod_spec(objects)["volumes"] if "hostPath" in v}


def _mounts(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in netmon_container(objects)["volumeMounts"]}


def _pod_annotations(objects: list[dict[str, Any]]) -> dict[str, str]:
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    annotations: dict[str, str] = daemonset["spec"]["template"]["metadata"]["annotations"]
    return annotations


def test_the_defaults_mount_no_inspector_directory_and_set_no_inspector_section() -> None:
    assert DEFAULTS["inspector"] == {
        "enabled": False,
        "hostPath": "/var/lib/netmon-inspector",
        "settings": {},
    }
    objects, notes = render({})
    paths = {v["path"] for v in _host_path_volumes(objects).values()}
    assert paths == {"/var/lib/netmon", "/run/netmon", "/var/lib/kubelet/pod-resources"}
    assert not any("inspector" in path for path in _mounts(objects))
    assert "inspector" not in netmon_yaml(objects)
    assert "NCCL Inspector" not in notes
    # A host path and settings, while off, change nothing.
    off = render({"inspector": {"hostPath": HOST_PATH, "settings": SETTINGS}})
    assert off == (objects, notes)


def test_enabled_the_daemonset_mounts_the_host_directory_read_write_at_the_same_path() -> None:
    objects, notes = render(ON)
    check_objects(objects)  # the API server's schemas (strict)
    lint(ON)
    volumes = {
        name: volume
        for name, volume in _host_path_volumes(objects).items()
        if volume["path"] == HOST_PATH
    }
    assert list(volumes.values()) == [{"path": HOST_PATH, "type": "DirectoryOrCreate"}]
    (name,) = volumes
    mount = _mounts(objects)[HOST_PATH]
    assert mount["name"] == name
    assert mount.get("readOnly", False) is False, "netmon removes ended pods' directories"
    # The netmon container, and the init container that marks the root (below) only.
    for init in pod_spec(objects)["initContainers"]:
        mounted = {m["name"] for m in init["volumeMounts"]}
        assert name not in mounted or init["name"] == "inspector-marker"
    # netmon.yaml: the mount's path as its dir, and every setting as given.
    assert netmon_yaml(objects)["inspector"] == {"dir": HOST_PATH, **SETTINGS}
    # Two capabilities more than without it, and nothing else: the pods' directories are their
    # users' (read: DAC_READ_SEARCH; an ended one removed: DAC_OVERRIDE).
    default = netmon_container(render({})[0])["securityContext"]
    context = netmon_container(objects)["securityContext"]
    assert context["capabilities"] == {
        "drop": ["ALL"],
        "add": ["DAC_READ_SEARCH", "DAC_OVERRIDE"],
    }
    assert {k: v for k, v in context.items() if k != "capabilities"} == {
        k: v for k, v in default.items() if k != "capabilities"
    }
    # The notes say where netmon reads and point at the chart README's section for the pods.
    (line,) = [line for line in notes.splitlines() if line.startswith("NCCL Inspector:")]
    assert f"{HOST_PATH}/<pod UID>" in line and f'"{SECTION}"' in line
    assert f"\n## {SECTION}\n" in (CHART / "README.md").read_text()
    # A change of settings rolls the pods (the configuration's checksum).
    again = render({"inspector": {**ON["inspector"], "settings": {"stale_after": "3h"}}})[0]
    annotations = [_pod_annotations(o) for o in (objects, again)]
    assert annotations[0]["checksum/config"] != annotations[1]["checksum/config"]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            ON,
            {
                "dir": HOST_PATH,
                "interval": 60.0,
                "window": 300.0,
                "grace": 300.0,
                "stale_after": 7200.0,
                "max_shapes": 8,
                "max_read_bytes": 4 << 20,
            },
        ),
        # netmon's defaults: stale_after is what removes a pod's directory (no .ended mark).
        (
            {"inspector": {"enabled": True}},
            {"dir": "/var/lib/netmon-inspector", "interval": 30.0, "stale_after": 6 * 3600.0},
        ),
    ],
    ids=["settings", "defaults"],
)
def test_the_rendered_netmon_yaml_passes_netmons_own_validation(
    values: dict[str, Any], expected: dict[str, Any], tmp_path: Path
) -> None:
    """The file as the pod reads it, loaded as `netmon check-config` and `netmon serve` load
    it (netmon.config.load_config, without NETMON_ variables)."""
    objects, _ = render(values)
    path = tmp_path / "netmon.yaml"
    (configmap,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "netmon"
    ]
    path.write_text(configmap["data"]["netmon.yaml"])
    config = load_config(path, environ={})
    assert config.inspector is not None
    assert config.inspector.dir == Path(expected.pop("dir"))
    assert config.inspector.dir.is_absolute()
    assert {key: getattr(config.inspector, key) for key in expected} == expected
    # And the mount is where netmon reads.
    assert str(config.inspector.dir) in _mounts(objects)


@pytest.mark.parametrize(
    "host_path",
    [
        "var/lib/netmon-inspector",
        "./inspector",
        "/var/lib/netmon-inspector/",
        "/var/../etc",
        "/",
        "",
        "/data//inspector",
        "/data/nccl inspector",
        # An allowed root itself, or a directory outside them: inspector.dir's own rule.
        "/var/lib",
        "/tmp",
        "/etc",
        "/data/nccl-inspector",
    ],
)
@pytest.mark.parametrize("enabled", [True, False])
def test_a_host_path_that_is_not_one_absolute_path_is_refused_by_the_schema(
    host_path: str, enabled: bool
) -> None:
    with pytest.raises(helm.HelmValuesError, match="/inspector/hostPath"):
        render({"inspector": {"enabled": enabled, "hostPath": host_path}})


@pytest.mark.parametrize(
    ("host_path", "mounted"),
    [
        ("/var/lib/netmon", "/var/lib/netmon"),
        ("/var/lib/netmon/inspector", "/var/lib/netmon"),
        ("/run/netmon/inspector", "/run/netmon"),
    ],
)
def test_a_host_path_over_the_charts_own_mounts_is_refused(host_path: str, mounted: str) -> None:
    message = rf"inspector\.hostPath \({host_path}\) overlaps {mounted}, which the chart mounts"
    with pytest.raises(helm.HelmRenderError, match=message):
        render({"inspector": {"enabled": True, "hostPath": host_path}})


@pytest.mark.parametrize("enabled", [True, False])
def test_config_inspector_is_refused_naming_both_keys(enabled: bool) -> None:
    """netmon.yaml's inspector section is the chart's: a dir of config.inspector's would not
    be the directory mounted. The message names config.inspector and inspector.*."""
    values = {"inspector": {"enabled": enabled}, "config": {"inspector": {"dir": HOST_PATH}}}
    with pytest.raises(
        helm.HelmRenderError,
        match=r"config\.inspector: .* inspector\.hostPath .* inspector\.settings .*"
        r"remove config\.inspector, set inspector\.enabled=true",
    ):
        render(values)
    # A null is no section (netmon reads inspector: null as none), and is left alone.
    objects, _ = render({"config": {"inspector": None}})
    assert netmon_yaml(objects).get("inspector") is None
    with pytest.raises(
        helm.HelmRenderError,
        match=r"inspector\.settings\.dir: the directory is inspector\.hostPath",
    ):
        render({"inspector": {"enabled": enabled, "settings": {"dir": HOST_PATH}}})


def test_enabled_an_init_container_marks_the_root_as_netmons_without_following_links(
    tmp_path: Path,
) -> None:
    """netmon removes pods' directories only under a root holding its mark (.netmon-inspector):
    the chart writes it before netmon starts, as root with no capability, and through no
    symbolic link left in its place. The command is run here as the pod would run it."""
    objects, _ = render(ON)
    (init,) = [c for c in pod_spec(objects)["initContainers"] if c["name"] == "inspector-marker"]
    assert [m["mountPath"] for m in init["volumeMounts"]] == [HOST_PATH]
    assert init["volumeMounts"][0].get("readOnly", False) is False
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    program, flag, code, marker = init["command"]
    assert (program, flag, marker) == ("python", "-c", f"{HOST_PATH}/.netmon-inspector")
    # The command itself, against a directory standing in for the host path.
    root = tmp_path / "inspector"
    root.mkdir()
    here = str(root / ".netmon-inspector")
    subprocess.run([sys.executable, "-c", code, here], check=True)
    assert (root / ".netmon-inspector").is_file()
    subprocess.run([sys.executable, "-c", code, here], check=True)  # again: a restart
    (root / ".netmon-inspector").unlink()
    (root / ".netmon-inspector").symlink_to(tmp_path / "elsewhere")
    failed = subprocess.run([sys.executable, "-c", code, here], capture_output=True)
    assert failed.returncode != 0 and not (tmp_path / "elsewhere").exists()
    # Off, no init container touches the directory.
    names = {c["name"] for c in pod_spec(render({})[0])["initContainers"]}
    assert names == {"state-owner"}


def test_the_documented_pod_mounts_only_its_own_directory_by_uid() -> None:
    """The chart's README gives the GPU pods' spec: the hostPath with subPathExpr $(POD_UID), so
    a pod sees <hostPath>/<its UID> and neither another pod's directory nor the root."""
    readme = (CHART / "README.md").read_text()
    section = readme.split(f"\n## {SECTION}\n", 1)[1].split("\n## ", 1)[0]
    (pod,) = [
        document
        for block in section.split("```yaml\n")[1:]
        for document in [yaml.safe_load(block.split("```", 1)[0])]
        if isinstance(document, dict) and document.get("kind") == "Pod"
    ]
    (volume,) = pod["spec"]["volumes"]
    assert volume["hostPath"]["path"] == DEFAULTS["inspector"]["hostPath"]
    (train,) = pod["spec"]["containers"]
    (mount,) = [m for m in train["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["subPathExpr"] == "$(POD_UID)" and "subPath" not in mount
    env = {e["name"]: e for e in train["env"]}
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    # The plugin dumps into the mount itself: the pod's own directory.
    assert env["NCCL_INSPECTOR_DUMP_DIR"]["value"] == mount["mountPath"]
    # No container or init container of the pod mounts the root whole.
    for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        for each in container.get("volumeMounts", []):
            assert each["name"] != volume["name"] or each.get("subPathExpr") == "$(POD_UID)"
