"""The kubelet guard for real: grpcio's server on a unix socket and an HTTPS server for the pod
list, netmon's clients, the idle decision.

The fake kubelet (tests/fake_kubelet.py) answers with bytes that google.protobuf encoded, and
with a PodList in JSON over TLS that wants a bearer token. The readings NVML would give are
replayed (this machine has no GPU): they say every GPU is idle.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket as sockets
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from netmon.config import load_config
from netmon.errors import ConfigError
from netmon.gpu import idle, idle_sources
from netmon.gpu import kubelet as kubelet_module
from netmon.gpu.idle import GpuReading
from netmon.gpu.idle_policy import IdlePolicy, KubeletPods
from netmon.gpu.idle_sources import ReplaySource
from netmon.gpu.kubelet import (
    KubeletError,
    KubeletGuard,
    list_pod_resources,
    list_pods,
    own_pod,
)
from netmon.gpu.podresources import decode_list_response, decode_pod_list, gpu_allocations
from tests.conftest import wait_for
from tests.fake_kubelet import (
    TOKEN,
    FakeKubelet,
    FakeKubeletPods,
    fake_kubelet,
    fake_kubelet_pods,
    pod_list,
    response,
    self_signed,
    serialize,
)

REPO = Path(__file__).resolve().parent.parent
U0 = "GPU-3f2a9c1e-7b4d-4e0a-9a61-2c5d8e0f1b77"
U1 = "GPU-b81d0e44-19a3-4c2f-8d7e-5e6a0c93d2f1"
MIG = "MIG-5e8b2c41-93d7-5a0f-b6e1-7c24d9f0a381"
OWN = ("netmon", "netmon-x7k2p")
# GPU 0 is a job's (its process has not started), a replica of GPU 1 is netmon's own pod's.
NODE = serialize(
    response(
        [
            ("ml", "train-0", [("trainer", [("nvidia.com/gpu", [U0])])]),
            ("netmon", "netmon-x7k2p", [("netmon", [("nvidia.com/gpu", [f"{U1}::0"])])]),
            ("kube-system", "dns", [("coredns", [])]),
        ]
    )
)


def reading(index: int, uuid: str, pids: tuple[int, ...] = (), mig: bool = False) -> GpuReading:
    """A GPU as NVML shows it when nothing runs there."""
    return GpuReading(
        index=index,
        uuid=uuid,
        utilization=0.0,
        memory_used=3 << 20,
        compute_pids=pids,
        process_memory=tuple(512 << 20 for _ in pids),
        mig_enabled=mig,
    )


IDLE_NODE = [reading(0, U0), reading(1, U1)]
# What the kubelet's /pods says of NODE's pods, the job's pod Running.
PODS = [
    ("ml", "train-0", "Running"),
    ("netmon", "netmon-x7k2p", "Running"),
    ("kube-system", "dns", "Running"),
]


class Policy:
    """The daemon's current idle policy, which a reload replaces."""

    def __init__(self, policy: IdlePolicy) -> None:
        self.policy = policy

    def __call__(self) -> IdlePolicy:
        return self.policy


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with fake_kubelet(tmp_path / "kubelet.sock", NODE) as served:
        yield served


def guard(socket: Path | None, own: tuple[str, str] | None = OWN, **policy: object) -> KubeletGuard:
    chosen = IdlePolicy.model_validate({"kubelet_socket": socket, "samples": 2, **policy})
    return KubeletGuard(ReplaySource([IDLE_NODE]), Policy(chosen), own)


def no_sleep(_seconds: float) -> None:
    pass


# --- the client, against a real gRPC server


def test_the_client_returns_the_kubelets_answer(kubelet: FakeKubelet) -> None:
    answer = list_pod_resources(kubelet.socket)
    assert answer == NODE
    assert kubelet.calls == 1  # and the request was the empty ListPodResourcesRequest
    held = gpu_allocations(decode_list_response(answer), OWN)
    assert set(held.gpus) == {U0.lower()}


def test_an_empty_node_is_an_empty_answer(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path / "k.sock", b"") as empty:
        assert decode_list_response(list_pod_resources(empty.socket)) == ()


def test_a_stalled_kubelet_is_given_up_at_the_timeout(kubelet: FakeKubelet) -> None:
    kubelet.stall = True
    started = time.monotonic()
    with pytest.raises(KubeletError, match=r"no answer within 0\.3 s"):
        list_pod_resources(kubelet.socket, timeout=0.3)
    assert time.monotonic() - started < 2.0


def test_a_missing_socket_says_what_to_mount(tmp_path: Path) -> None:
    with pytest.raises(KubeletError, match=r"no such socket .*pod-resources mounted"):
        list_pod_resources(tmp_path / "kubelet.sock")


def test_a_file_that_is_no_socket_is_named(tmp_path: Path) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    with pytest.raises(KubeletError, match="not a unix socket"):
        list_pod_resources(tmp_path / "kubelet.sock")


def test_a_socket_nobody_listens_on_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    with sockets.socket(sockets.AF_UNIX) as left_behind:
        left_behind.bind(str(path))  # a kubelet that died: the file stays, nothing accepts
    with pytest.raises(KubeletError, match="UNAVAILABLE"):
        list_pod_resources(path)


def test_a_kubelet_error_status_is_named(kubelet: FakeKubelet) -> None:
    import grpc

    kubelet.status = grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(KubeletError, match="UNIMPLEMENTED: told to fail"):
        list_pod_resources(kubelet.socket)


def _as_another_uid(code: str, *args: str) -> subprocess.CompletedProcess[str] | None:
    """`code` run as nobody (uid 65534), or None where no interpreter here lets nobody run it.

    The venv's python may be a link into root's home, which nobody cannot enter; then the
    system's python of the same version runs with the venv's packages.
    """
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(REPO), *packages])}
    for python in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        try:
            done = subprocess.run(
                [python, "-c", code, *args],
                capture_output=True,
                text=True,
                timeout=60,
                cwd="/",
                user=65534,
                group=65534,
                extra_groups=[],  # not root's group, which the kubelet's directory lets in
                env=env,
            )
        except OSError:
            continue
        if done.returncode == 0:
            return done
    return None


_ASK = (
    "import sys; from pathlib import Path; "
    "from netmon.gpu.kubelet import KubeletError, list_pod_resources\n"
    "try:\n    list_pod_resources(Path(sys.argv[1]))\n"
    "except KubeletError as exc:\n    print(exc)\n"
)


def _as_netmons_uid(socket: Path) -> str:
    """What list_pod_resources says to an unprivileged user, as the DaemonSet's uid 10001 is."""
    done = _as_another_uid(_ASK, str(socket))
    if done is None:
        pytest.skip("no python here that an unprivileged uid may run with netmon's packages")
    return done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a socket another uid may not use")
def test_the_kubelets_root_owned_socket_is_permission_denied_for_netmons_uid() -> None:
    # As the kubelet leaves it: a root-owned socket (mode 0755 under umask 022) in a directory
    # of mode 0750. The directory must be 0755 here to get as far as the socket at all.
    top = Path(tempfile.mkdtemp(prefix="netmon-kubelet-"))
    try:
        top.chmod(0o755)
        with fake_kubelet(top / "kubelet.sock", NODE):
            os.chmod(top / "kubelet.sock", 0o755)
            assert "permission denied (the socket is root's" in _as_netmons_uid(
                top / "kubelet.sock"
            )
            top.chmod(0o750)
            assert "permission denied on its directory" in _as_netmons_uid(top / "kubelet.sock")
    finally:
        top.chmod(0o700)
        for entry in top.iterdir():
            entry.unlink()
        top.rmdir()


def _threads_and_fds() -> tuple[int, int, int]:
    return (
        threading.active_count(),
        len(os.listdir("/proc/self/task")),  # gRPC's own threads are not Python's
        len(os.listdir("/proc/self/fd")),
    )


@pytest.fixture
def kubelet_process(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Two fake kubelets in another process (one answers, one stalls), so that the counts of
    threads and fds here are the client's alone."""
    ok, stalled = tmp_path / "ok.sock", tmp_path / "stalled.sock"
    children = []
    for path, mode in ((ok, []), (stalled, ["stall"])):
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_kubelet", str(path), NODE.hex(), *mode],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(child)

        def listening(child: subprocess.Popen[str] = child, path: Path = path) -> bool:
            assert child.poll() is None, "the fake kubelet exited"
            return path.exists()

        wait_for(listening, 30, "a fake kubelet to listen")
    try:
        yield ok, stalled
    finally:
        for child in children:
            child.kill()
            child.wait(10)
            assert child.stdin is not None and child.stdout is not None
            child.stdin.close()
            child.stdout.close()


def test_many_calls_leave_no_thread_and_no_fd_behind(kubelet_process: tuple[Path, Path]) -> None:
    ok, stalled = kubelet_process
    missing = ok.parent / "missing.sock"

    def every_kind() -> None:
        assert list_pod_resources(ok) == NODE
        with pytest.raises(KubeletError, match="no answer"):
            list_pod_resources(stalled, timeout=0.05)
        with pytest.raises(KubeletError, match="no such socket"):
            list_pod_resources(missing)

    wait_for(lambda: _answers(ok), 30, "the kubelet to answer")
    every_kind()  # gRPC starts its process-wide threads once, at first use
    before = _threads_and_fds()
    for _ in range(60):
        every_kind()
    for _ in range(200):
        list_pod_resources(ok)

    def settled() -> bool:
        # No growth; threads an earlier test left may end meanwhile, while a leak would show
        # as hundreds more after 380 calls.
        return all(now <= then for now, then in zip(_threads_and_fds(), before, strict=True))

    wait_for(settled, 5, f"(threads, OS threads, fds) back to at most {before}")


def _answers(socket: Path) -> bool:
    try:
        list_pod_resources(socket)
    except KubeletError:
        return False
    return True


# --- the guard: readings marked with the kubelet's answer


def test_the_guard_marks_gpus_that_other_pods_hold(kubelet: FakeKubelet) -> None:
    marked = guard(kubelet.socket).read()
    assert marked[0].allocated_to == (
        "pod ml/train-0 container trainer (nvidia.com/gpu), phase unknown, so taken as running: "
        "idle.kubelet_pods is not set"
    )
    assert marked[1].allocated_to is None  # netmon's own pod's replica
    assert all(r.allocation_error is None for r in marked)


def test_without_a_socket_the_guard_never_asks(tmp_path: Path) -> None:
    def lister(_socket: Path, _timeout: float) -> bytes:
        raise AssertionError("the kubelet was asked")

    unguarded = KubeletGuard(ReplaySource([IDLE_NODE]), Policy(IdlePolicy()), OWN, lister)
    assert unguarded.read() == IDLE_NODE


def test_a_reload_turns_the_guard_on_and_off(kubelet: FakeKubelet) -> None:
    policy = Policy(IdlePolicy())
    guarded = KubeletGuard(ReplaySource([IDLE_NODE]), policy, OWN)
    assert guarded.read()[0].allocated_to is None and kubelet.calls == 0
    policy.policy = IdlePolicy(kubelet_socket=kubelet.socket)
    assert guarded.read()[0].allocated_to is not None and kubelet.calls == 1
    policy.policy = IdlePolicy()
    assert guarded.read()[0].allocated_to is None and kubelet.calls == 1


def test_each_distinct_kubelet_error_is_logged_once_until_it_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    socket = tmp_path / "kubelet.sock"
    guarded = guard(socket)
    caplog.set_level(logging.INFO, logger="netmon.gpu.kubelet")

    def logged() -> list[str]:
        said = [r.getMessage() for r in caplog.records if r.name == "netmon.gpu.kubelet"]
        return [line for line in said if line.startswith("kubelet pod-resources")]

    for _ in range(5):
        assert guarded.read()[0].allocation_error is not None
    assert len(logged()) == 1 and "no such socket" in logged()[0]
    assert "no GPU is probed (kubelet_error)" in logged()[0]
    socket.write_text("")  # another error
    for _ in range(3):
        guarded.read()
    assert len(logged()) == 2 and "not a unix socket" in logged()[1]
    socket.unlink()
    for _ in range(3):
        guarded.read()
    assert len(logged()) == 2  # seen before, still failing
    with fake_kubelet(socket, NODE):
        guarded.read()
        guarded.read()
    assert len(logged()) == 3 and "answers again" in logged()[2]
    guarded.read()  # gone again: logged again, once
    guarded.read()
    assert len(logged()) == 4 and "no such socket" in logged()[3]


def test_an_unreadable_answer_is_a_kubelet_error(tmp_path: Path) -> None:
    with fake_kubelet(tmp_path / "k.sock", b"\x0a\x05ab") as broken:
        marked = guard(broken.socket).read()
    error = marked[0].allocation_error
    assert error is not None and "unreadable answer" in error and "claims 5 bytes" in error


# --- the decision, end to end: NVML says idle, the kubelet says otherwise


def test_a_gpu_nvml_calls_idle_but_a_pod_holds_is_busy_gpu_allocated(
    kubelet: FakeKubelet,
) -> None:
    decision = idle_sources.check(
        guard(kubelet.socket), ["0", "1"], {os.getpid()}, IdlePolicy(), no_sleep
    )
    assert not decision.idle
    assert decision.reason == "gpu_allocated"
    assert decision.busy == {"0": "gpu_allocated"}
    assert "allocated to pod ml/train-0 container trainer (nvidia.com/gpu)" in decision.detail
    # The other GPU: held only by netmon's own pod, which is not a job.
    assert idle_sources.check(
        guard(kubelet.socket), ["1"], {os.getpid()}, IdlePolicy(), no_sleep
    ).idle


def test_without_knowing_its_own_pod_netmon_counts_its_gpus_as_a_jobs(
    kubelet: FakeKubelet,
) -> None:
    decision = idle_sources.check(
        guard(kubelet.socket, own=None), ["1"], (), IdlePolicy(), no_sleep
    )
    assert decision.busy == {"1": "gpu_allocated"}
    assert "pod netmon/netmon-x7k2p" in decision.detail


def test_a_running_job_keeps_its_gpu_busy_process_label(kubelet: FakeKubelet) -> None:
    running = KubeletGuard(
        ReplaySource([[reading(0, U0, pids=(48213,)), reading(1, U1)]]),
        Policy(IdlePolicy(kubelet_socket=kubelet.socket)),
        OWN,
    )
    decision = idle_sources.check(running, ["0"], (), IdlePolicy(), no_sleep)
    assert decision.reason == "gpu_busy_process"
    assert "process(es) 48213" in decision.detail and "pod ml/train-0" in decision.detail


def test_a_kubelet_that_cannot_be_asked_blocks_probes_unless_unknowns_are_trusted(
    tmp_path: Path,
) -> None:
    absent = tmp_path / "kubelet.sock"
    decision = idle_sources.check(guard(absent), ["0", "1"], (), IdlePolicy(), no_sleep)
    assert decision.busy == {"0": "kubelet_error", "1": "kubelet_error"}
    assert "the kubelet cannot say who holds it" in decision.detail
    trusting = IdlePolicy(unknown_is_busy=False)
    assert idle_sources.check(guard(absent), ["0", "1"], (), trusting, no_sleep).idle


def test_kubelet_error_outranks_busy_reasons_and_gpu_allocated_follows_them() -> None:
    order = idle.REASONS
    assert order.index("nvml_error") < order.index("kubelet_error") < order.index("gpu_missing")
    assert order.index("gpu_busy_memory") < order.index("gpu_allocated")
    assert order.index("gpu_allocated") < order.index("gpu_unknown")


def test_an_allocated_mig_device_marks_every_gpu_in_mig_mode() -> None:
    answer = response([("ml", "mig-job", [("c", [("nvidia.com/mig-1g.5gb", [MIG])])])])
    held = gpu_allocations(decode_list_response(serialize(answer)))
    marked = idle.with_allocations([reading(0, U0, mig=True), reading(1, U1)], held)
    assert marked[0].allocated_to is not None and MIG in marked[0].allocated_to
    assert marked[1].allocated_to is None
    decision = idle.decide([marked], ["0"], (), IdlePolicy(skip_mig=False))
    assert decision.busy == {"0": "gpu_allocated"}


def test_device_ids_that_name_no_gpu_mark_every_gpu() -> None:
    answer = response([("ml", "job", [("c", [("nvidia.com/gpu", ["nvidia0"])])])])
    held = gpu_allocations(decode_list_response(serialize(answer)))
    marked = idle.with_allocations(IDLE_NODE, held)
    assert all(r.allocated_to is not None and "'nvidia0'" in r.allocated_to for r in marked)


def test_marks_from_an_earlier_answer_do_not_stick() -> None:
    held = gpu_allocations(decode_list_response(NODE), OWN)
    once = idle.with_allocations(IDLE_NODE, held)
    assert once[0].allocated_to is not None
    failed = idle.allocation_unknown(once, "down")
    assert failed[0].allocated_to is None and failed[0].allocation_error == "down"
    again = idle.with_allocations(failed, gpu_allocations(()))
    assert again == [replace(r, allocation_error=None) for r in failed] == IDLE_NODE


# --- configuration


def test_the_socket_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "netmon.yaml"
    path.write_text("idle:\n  kubelet_socket: /var/lib/kubelet/pod-resources/kubelet.sock\n")
    assert load_config(path, environ={}).idle.kubelet_socket == Path(
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )
    environ = {"NETMON_IDLE__KUBELET_SOCKET": "/run/kubelet.sock"}
    assert load_config(path, environ=environ).idle.kubelet_socket == Path("/run/kubelet.sock")
    off = load_config(path, environ={"NETMON_IDLE__KUBELET_SOCKET": ""})
    assert off.idle.kubelet_socket is None
    assert load_config(None, environ={}).idle.kubelet_socket is None


def test_a_relative_socket_path_is_a_one_line_error_naming_the_field() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, environ={"NETMON_IDLE__KUBELET_SOCKET": "kubelet.sock"})
    message = str(raised.value)
    assert "idle.kubelet_socket" in message and "absolute path" in message
    assert "\n" not in message


def test_the_pod_list_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "netmon.yaml"
    path.write_text("idle:\n  kubelet_pods:\n    url: https://10.0.0.5:10250/pods\n")
    listed = load_config(path, environ={}).idle.kubelet_pods
    assert listed == KubeletPods(url="https://10.0.0.5:10250/pods")
    assert listed.token_file == Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    assert listed.ca_file is None and not listed.insecure_skip_verify
    environ = {
        "NETMON_IDLE__KUBELET_PODS__URL": "https://[fd00::5]:10250/pods",
        "NETMON_IDLE__KUBELET_PODS__INSECURE_SKIP_VERIFY": "true",
    }
    from_env = load_config(None, environ=environ).idle.kubelet_pods
    assert from_env is not None and from_env.url == "https://[fd00::5]:10250/pods"
    assert from_env.insecure_skip_verify
    off = load_config(path, environ={"NETMON_IDLE__KUBELET_PODS": ""})
    assert off.idle.kubelet_pods is None
    assert load_config(None, environ={}).idle.kubelet_pods is None


@pytest.mark.parametrize(
    "url", ["10.0.0.5:10250/pods", "ftp://10.0.0.5/pods", "https://10.0.0.5:port/pods", "https://"]
)
def test_a_pod_list_url_that_is_no_http_url_is_a_one_line_error(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, environ={"NETMON_IDLE__KUBELET_PODS__URL": url})
    message = str(raised.value)
    assert "idle.kubelet_pods.url" in message and "https://10.0.0.5:10250/pods" in message
    assert "\n" not in message


def test_the_quiet_timer_is_gone_and_its_setting_is_named_as_unknown() -> None:
    with pytest.raises(ConfigError, match=r"kubelet_stale_after.*unknown setting.*kubelet_pods"):
        load_config(None, environ={"NETMON_IDLE__KUBELET_STALE_AFTER": "15m"})


def test_own_pod_needs_both_downward_api_variables() -> None:
    assert own_pod({"POD_NAME": "netmon-x7k2p", "POD_NAMESPACE": "netmon"}) == OWN
    assert own_pod({"POD_NAME": "netmon-x7k2p"}) is None
    assert own_pod({}) is None


# --- the daemon, black box: the env override, the guard's wiring, the skip counter


_SERVING = re.compile(r"listen\W+https?://127\.0\.0\.1:(\d+)/metrics")


def _skips(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "netmon_probe_skips_total":
                found[sample.labels["reason"]] = sample.value
            if sample.name == "netmon_probe_runs_total":
                found["runs"] = sample.value
    return found


def test_the_daemon_skips_a_gpu_the_kubelet_gave_to_a_running_pod(
    tmp_path: Path,
    kubelet: FakeKubelet,
    pods: FakeKubeletPods,
    token_file: Path,
    cert: tuple[Path, Path],
) -> None:
    config = {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "backend": "nccl",
        "devices": ["0"],
        "pause_file": str(tmp_path / "pause"),
        "pause_dir": str(tmp_path / "pause.d"),
        "probes": [{"name": "small", "sizes": [8], "interval": "1s"}],
        "idle": {"samples": 1},
    }
    (tmp_path / "netmon.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "nvml.json").write_text(
        json.dumps([[{**vars(r), "compute_pids": [], "process_memory": []} for r in IDLE_NODE]])
    )
    config_path = str(tmp_path / "netmon.yaml")
    replay = ("--idle-replay", str(tmp_path / "nvml.json"))
    log_path = tmp_path / "netmon.log"
    env = {
        **os.environ,
        "NETMON_IDLE__KUBELET_SOCKET": str(kubelet.socket),
        # As the DaemonSet would set them (docs/DEPLOY.md), nested with "__".
        "NETMON_IDLE__KUBELET_PODS__URL": pods.url,
        "NETMON_IDLE__KUBELET_PODS__TOKEN_FILE": str(token_file),
        "NETMON_IDLE__KUBELET_PODS__CA_FILE": str(cert[0]),
    }
    env.pop("POD_NAME", None)
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "netmon", "serve", "--config", config_path, *replay],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
    try:

        def port() -> str | None:
            assert daemon.poll() is None, log_path.read_text()
            match = _SERVING.search(log_path.read_text(errors="replace"))
            return match.group(1) if match else None

        served = int(wait_for(port, 60, "the daemon to listen"))

        def two_skips() -> dict[str, float] | None:
            found = _skips(served)
            return found if found.get("gpu_allocated", 0) >= 2 else None

        skips = wait_for(two_skips, 60, "two gpu_allocated skips")
        assert skips["runs"] == 0 and skips["kubelet_error"] == 0
        # The pod list is read once per PODS_TTL_S (10 s), the pod-resources socket every time.
        assert kubelet.calls >= 2 and pods.calls >= 1
        assert "pod ml/train-0 container trainer (nvidia.com/gpu), phase Running" in (
            log_path.read_text()
        )
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
    assert daemon.returncode == 0, log_path.read_text()


# --- the kubelet's pod list, for each holder's phase: the client, against a real HTTPS server


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN)  # no newline, as the kubelet writes a projected token
    return path


@pytest.fixture
def pods(cert: tuple[Path, Path]) -> Iterator[FakeKubeletPods]:
    with fake_kubelet_pods(pod_list(PODS), cert) as served:
        yield served


def source(
    served: FakeKubeletPods, token: Path | None, ca: Path | None, **extra: object
) -> KubeletPods:
    return KubeletPods.model_validate(
        {"url": served.url, "token_file": token, "ca_file": ca, **extra}
    )


def test_the_pod_list_client_sends_the_token_and_returns_the_answer(
    pods: FakeKubeletPods, token_file: Path, cert: tuple[Path, Path]
) -> None:
    answer = list_pods(source(pods, token_file, cert[0]))
    assert answer == pod_list(PODS)
    assert pods.authorizations == [f"Bearer {TOKEN}"]
    assert [(p.namespace, p.name, p.phase) for p in decode_pod_list(answer)] == PODS


def test_a_kubelet_certificate_no_ca_vouches_for_is_refused_unless_verification_is_off(
    pods: FakeKubeletPods, token_file: Path
) -> None:
    # The kubelet's serving certificate is often its own, self-signed: not one the system trusts.
    with pytest.raises(KubeletError, match=r"certificate cannot be verified .*ca_file"):
        list_pods(source(pods, token_file, None))
    assert pods.authorizations == []  # the token never left
    insecure = source(pods, token_file, None, insecure_skip_verify=True)
    assert list_pods(insecure) == pod_list(PODS)


def test_a_token_the_kubelet_does_not_accept_is_named(
    pods: FakeKubeletPods, tmp_path: Path, cert: tuple[Path, Path]
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("eyJhbGciOiJSUzI1NiJ9.e30.bm90LWl0\n")
    with pytest.raises(KubeletError, match=r"HTTP 401 Unauthorized \(the token was not accepted"):
        list_pods(source(pods, wrong, cert[0]))
    assert pods.authorizations == ["Bearer eyJhbGciOiJSUzI1NiJ9.e30.bm90LWl0"]


def test_a_service_account_without_the_rbac_rule_is_told_what_it_lacks(
    pods: FakeKubeletPods, token_file: Path, cert: tuple[Path, Path]
) -> None:
    pods.status = 403
    with pytest.raises(KubeletError) as raised:
        list_pods(source(pods, token_file, cert[0]))
    message = str(raised.value)
    assert message.startswith(f"{pods.url}: HTTP 403 Forbidden (netmon's service account may")
    assert "subresource=pods" in message and "\n" not in message


def test_a_missing_or_broken_token_file_is_named(
    pods: FakeKubeletPods, tmp_path: Path, cert: tuple[Path, Path]
) -> None:
    with pytest.raises(KubeletError, match=r"no such file .*service-account token mounted"):
        list_pods(source(pods, tmp_path / "absent", cert[0]))
    broken = tmp_path / "broken"
    broken.write_text("abc\r\nX-Injected: 1")
    with pytest.raises(KubeletError, match="not a bearer token"):
        list_pods(source(pods, broken, cert[0]))
    assert pods.calls == 0


def test_a_stalled_pod_list_is_given_up_at_the_timeout(
    pods: FakeKubeletPods, token_file: Path, cert: tuple[Path, Path]
) -> None:
    pods.stall = True
    started = time.monotonic()
    with pytest.raises(KubeletError, match=r"no answer within 0\.3 s"):
        list_pods(source(pods, token_file, cert[0]), timeout=0.3)
    assert time.monotonic() - started < 2.0


def test_a_kubelet_that_does_not_listen_is_named(token_file: Path, cert: tuple[Path, Path]) -> None:
    with sockets.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    gone = KubeletPods(url=f"https://127.0.0.1:{port}/pods", token_file=token_file, ca_file=cert[0])
    with pytest.raises(KubeletError, match=f"127.0.0.1:{port}/pods: .*refused"):
        list_pods(gone)


def test_a_plain_http_port_is_asked_without_the_token(token_file: Path) -> None:
    with fake_kubelet_pods(pod_list(PODS)) as read_only:
        assert list_pods(source(read_only, token_file, None)) == pod_list(PODS)
    assert read_only.authorizations == [None]


def test_an_answer_beyond_the_limit_is_refused(
    pods: FakeKubeletPods,
    token_file: Path,
    cert: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kubelet_module, "MAX_POD_LIST_BYTES", 1 << 20)
    pods.answer = pod_list([("ml", f"p-{i}", "Running") for i in range(3000)])
    assert len(pods.answer) > 1 << 20
    with pytest.raises(KubeletError, match="larger than 1 MiB"):
        list_pods(source(pods, token_file, cert[0]))


# --- the guard: a pod holds its GPU until its phase says it has finished


def phase_guard(
    socket: Path,
    pods: FakeKubeletPods | None,
    token_file: Path,
    cert: tuple[Path, Path],
    readings: list[GpuReading] = IDLE_NODE,
) -> KubeletGuard:
    listed = None if pods is None else source(pods, token_file, cert[0])
    chosen = IdlePolicy(kubelet_socket=socket, kubelet_pods=listed, samples=2)
    return KubeletGuard(ReplaySource([readings]), Policy(chosen), OWN)


def check(guarded: KubeletGuard, device: str = "0") -> idle.IdleDecision:
    return idle_sources.check(guarded, [device], {os.getpid()}, IdlePolicy(samples=2), no_sleep)


def test_a_running_pod_with_no_process_keeps_its_gpu_however_long_it_stays_quiet(
    kubelet: FakeKubelet, pods: FakeKubeletPods, token_file: Path, cert: tuple[Path, Path]
) -> None:
    """An inference server waiting for requests, a job staging data: the GPU shows no process
    for as long as that lasts. The guard once let such a GPU go after 15 quiet minutes
    (idle.kubelet_stale_after); now there is no clock in the decision at all, only the phase."""
    guarded = phase_guard(kubelet.socket, pods, token_file, cert)
    now = [0.0]
    guarded.clock = lambda: now[0]
    for _ in range(20):  # every reading alike: only the phase decides
        decision = check(guarded)
        assert decision.busy == {"0": "gpu_allocated"}
        assert "pod ml/train-0 container trainer (nvidia.com/gpu), phase Running" in decision.detail
        now[0] += 1.0
    # The pod list is read again once PODS_TTL_S has passed, not at every reading (issue 34:
    # the whole PodList over a new TLS connection, several times a second).
    assert pods.calls == 2


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown", None])
def test_a_pod_in_any_phase_but_a_terminal_one_keeps_its_gpu(
    phase: str | None,
    kubelet: FakeKubelet,
    pods: FakeKubeletPods,
    token_file: Path,
    cert: tuple[Path, Path],
) -> None:
    pods.answer = pod_list([("ml", "train-0", phase)])
    decision = check(phase_guard(kubelet.socket, pods, token_file, cert))
    assert decision.busy == {"0": "gpu_allocated"}
    assert f"phase {phase or 'not set yet'}" in decision.detail


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_gives_its_gpu_back(
    phase: str,
    kubelet: FakeKubelet,
    pods: FakeKubeletPods,
    token_file: Path,
    cert: tuple[Path, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="netmon.gpu.kubelet")
    pods.answer = pod_list([("ml", "train-0", phase), ("netmon", "netmon-x7k2p", "Running")])
    guarded = phase_guard(kubelet.socket, pods, token_file, cert)
    assert guarded.read()[0].allocated_to is None
    assert check(guarded).idle
    finished = [r.getMessage() for r in caplog.records if "has finished" in r.getMessage()]
    assert finished == [
        f"kubelet: pod ml/train-0 ({phase}) has finished, though the pod-resources answer still "
        "lists its devices (kubernetes issue 119423): its GPUs may be probed"
    ]  # once, for all the readings


def test_a_finished_pod_whose_name_is_taken_again_does_not_give_the_gpu_back(
    kubelet: FakeKubelet, pods: FakeKubeletPods, token_file: Path, cert: tuple[Path, Path]
) -> None:
    # A StatefulSet's train-0 recreated: both listed for a moment, and pod-resources gives no UID.
    pods.answer = pod_list([("ml", "train-0", "Failed"), ("ml", "train-0", "Pending")])
    decision = check(phase_guard(kubelet.socket, pods, token_file, cert))
    assert decision.busy == {"0": "gpu_allocated"} and "phase Pending" in decision.detail


def _down(pods: FakeKubeletPods) -> str:
    pods.stop()
    return "refused"


def _stalled(pods: FakeKubeletPods) -> str:
    pods.stall = True
    pods.stall_s = 5.0
    return "no answer within 2 s"


def _forbidden(pods: FakeKubeletPods) -> str:
    pods.status = 403
    return "HTTP 403 Forbidden (netmon's service account may not get nodes/pods"


def _not_listed(pods: FakeKubeletPods) -> str:
    pods.answer = pod_list([("ml", "train-1", "Succeeded")])
    return "not in the kubelet's pod list"


def _garbled(pods: FakeKubeletPods) -> str:
    pods.answer = b'{"kind": "Status", "status": "Failure"}'
    return "unreadable answer: PodList: the answer is a 'Status', not a PodList"


@pytest.mark.parametrize(
    "break_it", [_down, _stalled, _forbidden, _not_listed, _garbled], ids=lambda f: f.__name__[1:]
)
def test_a_phase_that_cannot_be_read_keeps_the_gpu_the_pods_and_says_why(
    break_it: Callable[[FakeKubeletPods], str],
    kubelet: FakeKubelet,
    pods: FakeKubeletPods,
    token_file: Path,
    cert: tuple[Path, Path],
) -> None:
    why = break_it(pods)
    decision = check(phase_guard(kubelet.socket, pods, token_file, cert))
    assert decision.busy == {"0": "gpu_allocated"}
    assert (
        "pod ml/train-0 container trainer (nvidia.com/gpu), phase unknown, so taken as "
        "running: " in decision.detail
    )
    assert why in decision.detail


def test_without_a_pod_list_every_listed_pod_keeps_its_gpu(kubelet: FakeKubelet) -> None:
    decision = check(guard(kubelet.socket))
    assert decision.busy == {"0": "gpu_allocated"}
    assert "phase unknown, so taken as running: idle.kubelet_pods is not set" in decision.detail


def test_the_pod_list_is_asked_only_when_some_pod_holds_a_gpu(
    tmp_path: Path, pods: FakeKubeletPods, token_file: Path, cert: tuple[Path, Path]
) -> None:
    only_netmon = serialize(
        response([("netmon", "netmon-x7k2p", [("netmon", [("nvidia.com/gpu", [U1])])])])
    )
    with fake_kubelet(tmp_path / "k.sock", only_netmon) as quiet:
        assert check(phase_guard(quiet.socket, pods, token_file, cert)).idle
    assert pods.calls == 0


def test_each_pod_list_error_is_logged_once_until_it_answers(
    kubelet: FakeKubelet,
    pods: FakeKubeletPods,
    token_file: Path,
    cert: tuple[Path, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="netmon.gpu.kubelet")
    guarded = phase_guard(kubelet.socket, pods, token_file, cert)

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("kubelet pods")]

    pods.status = 403
    for _ in range(4):
        guarded.read()
    assert len(logged()) == 1 and "HTTP 403" in logged()[0] and "keeps it" in logged()[0]
    pods.status = None
    guarded.read()
    guarded.read()
    assert len(logged()) == 2 and logged()[1] == f"kubelet pods: {pods.url} answers"
