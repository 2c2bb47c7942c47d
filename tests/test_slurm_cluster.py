"""Smoke tests of tests.slurm_cluster: a real slurmctld and slurmd's in network namespaces run
jobs on their own hosts and addresses, preempt the `sweep` partition, and leave nothing behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netmon.sweep.locate.fabric import Cable, Uplink
from netmon.sweep.locate.fabric_file import parse_topology
from netmon.sweep.settings import SweepConfig
from netmon.sweep.slurm.scheduler import SlurmScheduler
from tests.conftest import wait_for
from tests.netns import require_root
from tests.slurm_cluster import SLURM_PATH, SlurmCluster, process_alive


def _require_slurm() -> None:
    require_root()
    tools = ("slurmctld", "slurmd", "munged", "mungekey", "srun")
    missing = [tool for tool in tools if not shutil.which(tool, path=SLURM_PATH)]
    if missing:
        pytest.fail(f"{missing} not installed: run scripts/test-deps")


# Two leaves under one spine, in topology.conf's syntax (topology.conf(5)).
TOPOLOGY = (
    "\n".join(
        [
            "SwitchName=leaf1 Nodes=n[1-2]",
            "SwitchName=leaf2 Nodes=n3",
            "SwitchName=spine Switches=leaf[1-2]",
        ]
    )
    + "\n"
)


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[SlurmCluster]:
    _require_slurm()
    with SlurmCluster(nodes=3, topology=TOPOLOGY) as cluster:
        yield cluster


@pytest.fixture
def cluster(shared_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The module's cluster, with every job cancelled after each test."""
    yield shared_cluster
    shared_cluster.cancel_all()


def _processes(cluster: SlurmCluster, node: str) -> list[list[str]]:
    """argv of every process in the node's namespace, argv[0] without its directory (srun runs
    `sleep` as /usr/bin/sleep, a batch script as plain `sleep`)."""
    found = []
    for pid in cluster.pids(node):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]
        except OSError:
            continue  # exited meanwhile
        if argv:
            found.append([os.path.basename(argv[0]), *argv[1:]])
    return found


def test_jobs_run_on_their_own_hosts_and_addresses(cluster: SlurmCluster) -> None:
    hosts = cluster.run(["srun", "-p", "batch", "-N3", "hostname"], timeout=30, check=True)
    assert sorted(hosts.stdout.split()) == ["n1", "n2", "n3"]

    script = 'echo "$(hostname) $(ip -4 -o addr show eth0)"'
    out = cluster.run(["srun", "-N2", "-w", "n1,n2", "sh", "-c", script], timeout=30, check=True)
    seen = {line.split()[0]: re.findall(r"inet (\S+)/24", line) for line in out.stdout.splitlines()}
    assert seen == {"n1": [cluster.address("n1")], "n2": [cluster.address("n2")]}


def test_batch_preempts_sweep(cluster: SlurmCluster) -> None:
    """Observed (slurm 22.05.8): the batch job starts about 1 s after it is submitted; the
    sweep job shows JobState=PREEMPTED (squeue %T PREEMPTED, %t PR), Reason=None,
    ExitCode=0:15, and stays listed with --states=all for MinJobAge."""
    sweep = cluster.sbatch("-p", "sweep", "-N1", "-w", "n1", "--exclusive", "--wrap", "sleep 300")
    wait_for(lambda: cluster.job_state(sweep) == "RUNNING", 10, "the sweep job to run")

    submitted = time.monotonic()
    batch = cluster.sbatch("-p", "batch", "-N1", "-w", "n1", "--exclusive", "--wrap", "sleep 120")
    wait_for(lambda: cluster.job_state(batch) == "RUNNING", 10, "the batch job to run")
    print(f"batch job ran {time.monotonic() - submitted:.2f} s after submission")

    assert cluster.job_state(sweep) == "PREEMPTED"
    listed = cluster.run(["squeue", "--states=all", "-h", "-j", sweep, "-o", "%T %t"], timeout=10)
    assert listed.stdout.split() == ["PREEMPTED", "PR"]
    wait_for(
        lambda: ["sleep", "300"] not in _processes(cluster, "n1"),
        10,
        "the preempted job's sleep to end",
    )
    # RUNNING in slurmctld comes a moment before slurmstepd has started the script.
    wait_for(lambda: ["sleep", "120"] in _processes(cluster, "n1"), 10, "the batch job's sleep")


def test_preempted_srun_says_so(cluster: SlurmCluster) -> None:
    """Observed: srun exits 143 and its stderr has `slurmstepd-n2: error: *** STEP <id>.0 ON
    n2 CANCELLED AT <time> DUE TO PREEMPTION ***`, then `srun: error: n2: task 0: Terminated`."""
    sweep = cluster.popen(["srun", "-p", "sweep", "-N1", "-w", "n2", "--exclusive", "sleep", "300"])
    wait_for(lambda: ["sleep", "300"] in _processes(cluster, "n2"), 10, "the sweep step to run")

    preemptor = ["srun", "-p", "batch", "-N1", "-w", "n2", "--exclusive", "hostname"]
    assert cluster.run(preemptor, timeout=30).stdout.split() == ["n2"]
    try:
        _, stderr = sweep.communicate(timeout=20)
    finally:
        sweep.kill()
    assert sweep.returncode != 0
    assert "DUE TO PREEMPTION" in stderr


def _leftovers(cluster: SlurmCluster, pids: set[int]) -> tuple[list[int], list[str], bool]:
    # A zombie is dead: job processes are orphans, and PID 1 here reaps them a little later.
    alive = [pid for pid in pids if process_alive(pid)]
    tagged = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    spaces = [line for line in tagged.splitlines() if cluster.spaces and cluster.spaces.tag in line]
    return alive, spaces, cluster.dir.exists()


def test_teardown_leaves_nothing() -> None:
    """A running job (slurmstepd, a shell, a sleep) and every daemon are gone at exit."""
    _require_slurm()
    with SlurmCluster(nodes=2) as cluster:
        cluster.sbatch("-N2", "--wrap", "srun sleep 300")
        wait_for(lambda: ["sleep", "300"] in _processes(cluster, "n2"), 10, "the job on n2")
        pids = {pid for name in ("ctl", *cluster.node_names) for pid in cluster.pids(name)}
        assert cluster.munged is not None
        pids.add(cluster.munged.pid)
    assert _leftovers(cluster, pids) == ([], [], False)


def test_failed_start_tears_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that fails midway (here: the second slurmd) removes what it had made."""
    _require_slurm()
    started = SlurmCluster.start_slurmd

    def second_fails(self: SlurmCluster, node: str) -> None:
        if node == "n2":
            raise RuntimeError("injected")
        started(self, node)

    monkeypatch.setattr(SlurmCluster, "start_slurmd", second_fails)
    cluster = SlurmCluster(nodes=2)
    with pytest.raises(RuntimeError, match="injected"), cluster:
        pass
    assert cluster.slurmctld is not None and cluster.munged is not None
    pids = {cluster.slurmctld.pid, cluster.munged.pid, cluster.slurmd["n1"].pid}
    assert _leftovers(cluster, pids) == ([], [], False)


def test_the_sweep_reads_the_fabric_from_slurm(cluster: SlurmCluster) -> None:
    """The scheduler's fabric (`scontrol show topology`, or, as with this Slurm 22.05 whose
    scontrol answers "Insane message length", the topology.conf beside slurm.conf) parses into
    the fabric the planner uses: n1 and n2 under one leaf, n3 under the other, one spine."""
    scheduler = SlurmScheduler(SweepConfig(), "t", "sweep", environ=cluster.env())
    text = scheduler.topology()
    assert text is not None, "scontrol show topology printed no switches"
    fabric = parse_topology(text, rails=2)
    assert fabric.leaf("n1", 0) == fabric.leaf("n2", 0) == "leaf1/rail0"
    assert fabric.leaf("n3", 1) == "leaf2/rail1"
    assert fabric.spines["leaf1/rail1"] == ("spine/rail1",)
    assert not fabric.crosses(("n1", "n2"), 0) and fabric.crosses(("n1", "n3"), 1)
    assert fabric.links(("n1", "n3"), 0) == {
        Cable("n1", 0),
        Cable("n3", 0),
        Uplink("leaf1/rail0", "spine/rail0"),
        Uplink("leaf2/rail0", "spine/rail0"),
    }
