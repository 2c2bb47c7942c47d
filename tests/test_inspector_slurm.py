"""NCCL Inspector on Slurm (deploy/slurm): the prolog makes each job a dump directory of its
user's, the task prolog points NCCL at the plugin and at it, the epilog marks it ended, and the
daemon reads the dumps and removes the directory after its grace.

The scripts run first with a made-up Slurm environment (as root, and the task prolog as
`nobody`), then on a real Slurm (tests/slurm_cluster.py) with a real daemon: a job run as
`nobody` dumps into the directory Slurm's environment named, and /metrics shows what it wrote.
No GPU here: the plugin is a placeholder file, and the job copies a dump written the way the
plugin writes one (tests/inspector_files.py).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProcess, fast_config, wait_until
from tests.inspector_files import MARKER, prom_dump, training_comms
from tests.netns import require_root
from tests.slurm_cluster import SLURM_PATH, SlurmCluster
from tests.tools import ROOT

SLURM = ROOT / "deploy" / "slurm"
NOBODY = pwd.getpwnam("nobody")
PLUGIN_NAME = "libnccl-profiler-inspector.so"
INTERVAL_US = "30000000"
Completed = subprocess.CompletedProcess[str]


def _require_slurm() -> None:
    require_root()
    tools = ("slurmctld", "slurmd", "munged", "mungekey", "srun")
    missing = [tool for tool in tools if not shutil.which(tool, path=SLURM_PATH)]
    if missing:
        pytest.fail(f"{missing} not installed: run scripts/test-deps")


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A directory `nobody` can pass through: pytest's tmp_path lies under a 0700 directory."""
    path = Path(tempfile.mkdtemp(prefix="netmon-inspector-"))
    try:
        path.chmod(0o711)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Node:
    """One node's settings, as /etc/netmon/slurm.conf would hold them: the inspector directory
    (root's, 0755, as a site makes it), the plugin (a placeholder) and the pause file."""

    def __init__(self, root: Path, plugin: bool = True) -> None:
        self.root = root
        self.base = root / "inspector"
        self.base.mkdir(mode=0o755)
        self.base.chmod(0o755)
        self.plugin = root / "lib" / PLUGIN_NAME
        if plugin:
            self.plugin.parent.mkdir(mode=0o755)
            self.plugin.write_bytes(b"\x7fELF placeholder")
            self.plugin.chmod(0o644)
        self.pause = root / "run" / "pause"
        self.conf = root / "netmon-slurm.conf"
        self.settings(self.base)

    def settings(self, base: Path | str) -> None:
        """The settings file, which wins over the environment (netmon-pause.sh)."""
        self.conf.write_text(
            "# /etc/netmon/slurm.conf\n"
            f"NETMON_INSPECTOR_DIR={base}\n"
            f"NETMON_INSPECTOR_PLUGIN={self.plugin}\n"
            f"NETMON_PAUSE_FILE={self.pause}\n"
        )
        self.conf.chmod(0o644)

    def job_dir(self, job: str) -> Path:
        return self.base / job

    def exports(self, job: str) -> list[str]:
        return [
            f"export NCCL_PROFILER_PLUGIN={self.plugin}",
            "export NCCL_INSPECTOR_ENABLE=1",
            "export NCCL_INSPECTOR_PROM_DUMP=1",
            f"export NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS={INTERVAL_US}",
            f"export NCCL_INSPECTOR_DUMP_DIR={self.job_dir(job)}",
        ]

    def env(self, **extra: str) -> dict[str, str]:
        # Nothing of this machine's Slurm, netmon or NCCL settings: only what the test says.
        own = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "NETMON_", "NCCL_")) and k != "CUDA_VISIBLE_DEVICES"
        }
        return {**own, "NETMON_SLURM_CONF": str(self.conf), **extra}

    def run(self, script: str, env: dict[str, str], as_user: bool = False) -> Completed:
        """A script as Slurm runs it: the prolog and epilog as root, the task prolog as the
        job's user (`nobody` here); it must exit 0 whatever happens."""
        done = subprocess.run(
            [str(SLURM / script)],
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            user=NOBODY.pw_uid if as_user else None,
            group=NOBODY.pw_gid if as_user else None,
            extra_groups=[] if as_user else None,
        )
        assert done.returncode == 0, f"{script} exited {done.returncode}: {done.stderr}"
        return done

    def prolog(self, job: str, uid: int = NOBODY.pw_uid, gid: int = NOBODY.pw_gid) -> str:
        ids = {"SLURM_JOB_ID": job, "SLURM_JOB_UID": str(uid), "SLURM_JOB_GID": str(gid)}
        return self.run("prolog.sh", ids).stderr

    def task_prolog(self, job: str, **extra: str) -> Completed:
        return self.run("task_prolog.sh", {"SLURM_JOB_ID": job, **extra}, as_user=True)

    def epilog(self, job: str) -> str:
        return self.run("epilog.sh", {"SLURM_JOB_ID": job}).stderr


def _owner_and_mode(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def _as_nobody(*argv: str) -> Completed:
    return subprocess.run(
        argv,
        user=NOBODY.pw_uid,
        group=NOBODY.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def node() -> Iterator[Node]:
    require_root()  # directories are given to `nobody`, and the task prolog runs as it
    with _scratch() as root:
        yield Node(root)


# The scripts, without Slurm


def test_a_job_gets_a_directory_of_its_own_and_the_exports_that_name_it(node: Node) -> None:
    assert not (node.base / MARKER).exists()
    node.prolog("41")
    job_dir = node.job_dir("41")
    assert not job_dir.is_symlink() and job_dir.is_dir()
    # The root marked as netmon's (root's, a regular file), for a site whose setup did not.
    marker = (node.base / MARKER).lstat()
    assert stat.S_ISREG(marker.st_mode) and marker.st_uid == 0
    assert _owner_and_mode(job_dir) == (NOBODY.pw_uid, NOBODY.pw_gid, 0o700)
    done = node.task_prolog("41")
    assert done.stdout.splitlines() == node.exports("41")
    assert done.stderr == ""
    # The job's user writes its dumps there; another job's user cannot even look in.
    assert _as_nobody("touch", str(job_dir / "dump.prom")).returncode == 0
    node.prolog("42", uid=NOBODY.pw_uid - 1, gid=NOBODY.pw_gid - 1)
    assert _as_nobody("ls", str(node.job_dir("42"))).returncode != 0
    assert node.task_prolog("42").stdout == "", "not nobody's directory: no exports"

    node.epilog("41")
    ended = job_dir / ".ended"
    assert ended.is_file() and not ended.is_symlink()
    assert time.time() - ended.stat().st_mtime < 30
    # Locked: the user can add nothing more, the daemon still reads what the job wrote.
    assert _owner_and_mode(job_dir) == (0, 0, 0o700)
    assert (job_dir / "dump.prom").exists()
    assert node.task_prolog("41").stdout == ""


def test_a_requeued_job_gets_its_directory_back_without_the_end_mark(node: Node) -> None:
    node.prolog("43")
    (node.job_dir("43") / "dump.prom").write_text("")
    node.epilog("43")
    node.prolog("43")  # Slurm requeues a job under the same id
    job_dir = node.job_dir("43")
    assert _owner_and_mode(job_dir) == (NOBODY.pw_uid, NOBODY.pw_gid, 0o700)
    assert not (job_dir / ".ended").exists(), "netmon would remove it under the running job"
    assert (job_dir / "dump.prom").exists()
    assert node.task_prolog("43").stdout.splitlines() == node.exports("43")


def test_without_the_plugin_no_directory_and_no_exports(node: Node) -> None:
    node.plugin.unlink()
    assert node.prolog("44") == "", "a site without the plugin hears nothing of Inspector"
    assert not node.job_dir("44").exists()
    done = node.task_prolog("44")
    assert (done.stdout, done.stderr) == ("", "")
    assert node.epilog("44") == ""
    assert list(node.base.iterdir()) == []
    # Removed after the prolog: no exports for a plugin NCCL would fail to load.
    node.plugin.write_bytes(b"")
    node.prolog("45")
    node.plugin.unlink()
    assert node.task_prolog("45").stdout == ""
    node.epilog("45")
    assert (node.job_dir("45") / ".ended").is_file(), "the directory still ends and goes"


def test_the_jobs_own_profiler_plugin_is_respected(node: Node) -> None:
    node.prolog("46")
    for own in ("/home/alice/libnccl-profiler-mine.so", "none", ""):
        done = node.task_prolog("46", NCCL_PROFILER_PLUGIN=own)
        assert done.stdout == "", own
        assert f"the job sets NCCL_PROFILER_PLUGIN={own}; netmon does not turn" in done.stderr


def test_a_planted_symlink_is_never_followed(node: Node) -> None:
    elsewhere = node.root / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    elsewhere.chmod(0o755)
    node.job_dir("47").symlink_to(elsewhere)
    assert "is a symlink: not following it" in node.prolog("47")
    assert node.job_dir("47").is_symlink()
    assert _owner_and_mode(elsewhere) == (0, 0, 0o755), "not given to the job's user"
    assert node.task_prolog("47").stdout == ""
    assert "is a symlink: not following it" in node.epilog("47")
    assert list(elsewhere.iterdir()) == [] and _owner_and_mode(elsewhere) == (0, 0, 0o755)

    # The user owns the job's directory and may plant .ended as a link to a file of root's, or
    # as a hard link to it: the epilog (root) replaces the name, never writes through it.
    victim = node.root / "victim"
    victim.write_text("root's\n")
    old = victim.stat().st_mtime_ns
    os.utime(victim, ns=(old - 10**10, old - 10**10))
    before = victim.stat()
    for job, plant in (("48", os.symlink), ("49", os.link)):
        node.prolog(job)
        plant(victim, node.job_dir(job) / ".ended")
        node.epilog(job)
        ended = node.job_dir(job) / ".ended"
        assert ended.is_file() and not ended.is_symlink() and ended.stat().st_ino != before.st_ino
        assert ended.stat().st_size == 0
        after = victim.stat()
        assert (after.st_mtime_ns, after.st_nlink, victim.read_text()) == (
            before.st_mtime_ns,
            1,
            "root's\n",
        )
    # A name planted in the inspector directory before the job: the prolog makes nothing there.
    missing = node.root / "missing"
    node.job_dir("50").symlink_to(missing)  # dangling: mkdir must not make its target
    node.prolog("50")
    assert not missing.exists()


def test_a_directory_users_could_write_is_refused(node: Node) -> None:
    for mode in (0o1777, 0o775):
        node.base.chmod(mode)
        assert "must be root's and writable by no one else" in node.prolog("51")
        assert not node.job_dir("51").exists()
    node.base.chmod(0o755)
    os.chown(node.base, NOBODY.pw_uid, NOBODY.pw_gid)
    assert "must be root's and writable by no one else" in node.prolog("51")
    assert not node.job_dir("51").exists()


def test_the_scripts_never_fail(node: Node) -> None:
    # Node.run asserts exit 0 for every one of these.
    node.run("prolog.sh", {})  # no SLURM_JOB_ID
    node.run("epilog.sh", {})
    node.run("task_prolog.sh", {}, as_user=True)
    node.prolog("../../etc")  # not a job id: no path is made of it
    node.epilog("../../etc")
    assert node.task_prolog("../../etc").stdout == ""
    assert list(node.base.iterdir()) == []
    for uid, gid in (("", ""), ("x", "1"), ("1", "")):
        ids = {"SLURM_JOB_ID": "52", "SLURM_JOB_UID": uid, "SLURM_JOB_GID": gid}
        assert "are not ids" in node.run("prolog.sh", ids).stderr
    assert not node.job_dir("52").exists()
    node.job_dir("53").write_text("a file, not a directory")
    assert "exists and is not the job's directory" in node.prolog("53")
    assert "is not a directory; leaving it alone" in node.epilog("53")
    node.job_dir("54").mkdir()
    os.chown(node.job_dir("54"), 4242, 4242)  # a stale directory of another user's
    assert "exists and is not the job's directory" in node.prolog("54")
    assert _owner_and_mode(node.job_dir("54"))[:2] == (4242, 4242)
    # /proc refuses new directories (no pid is this big); then an absent one, and a file.
    for base, says in (
        ("/proc", "could not make /proc/999999999"),
        ("/proc/netmon-test", "is not a directory"),
        (str(node.plugin), "is not a directory"),
    ):
        node.settings(base)
        said = node.prolog("999999999", uid=1, gid=1)
        assert says in said, said
        node.epilog("999999999")
        assert node.task_prolog("999999999").stdout == ""


# On a real Slurm, with the daemon


def _wrapper(directory: Path, script: str, conf: Path) -> Path:
    """slurmd runs the prolog and epilog with Slurm's variables only, the task prolog with the
    job's: none has ours. A node finds its settings in /etc/netmon/slurm.conf; here a wrapper
    names the test's, then runs the script itself (its $0 stays deploy/slurm's)."""
    path = directory / script
    path.write_text(f'#!/bin/sh\nNETMON_SLURM_CONF={conf} exec {SLURM / script} "$@"\n')
    path.chmod(0o755)
    return path


# The job: its NCCL variables to its output, the dump where NCCL would put it, then it waits for
# the test (bounded), so the directory is looked at while the job runs.
JOB = """#!/bin/sh
env | grep '^NCCL_' | sort
if [ -n "${NCCL_INSPECTOR_DUMP_DIR:-}" ]; then
  cp "$1"/*.prom "$NCCL_INSPECTOR_DUMP_DIR"/
fi
i=0
while [ ! -e "$2" ] && [ "$i" -lt 300 ]; do
  sleep 0.1
  i=$((i + 1))
done
"""


def test_a_slurm_job_dumps_where_the_daemon_reads_and_its_directory_goes(tmp_path: Path) -> None:
    _require_slurm()
    with _scratch() as root:
        node = Node(root)
        scripts = root / "slurm"
        scripts.mkdir(mode=0o755)
        settings = {
            "Prolog": str(_wrapper(scripts, "prolog.sh", node.conf)),
            "TaskProlog": str(_wrapper(scripts, "task_prolog.sh", node.conf)),
            "Epilog": str(_wrapper(scripts, "epilog.sh", node.conf)),
            "PrologFlags": "Alloc",
        }
        # One dump of an 8-GPU node's 16 communicators, as the plugin writes it: the job copies it.
        stage = root / "stage"
        stage.mkdir(mode=0o755)
        prom_dump(stage, training_comms(), lambda comm, gpu: 150.0, at=time.time(), sn=7, host="n1")
        for path in stage.iterdir():
            path.chmod(0o644)
        job_script = root / "job.sh"
        job_script.write_text(JOB)
        job_script.chmod(0o755)
        out = root / "out"
        out.mkdir(mode=0o755)
        os.chown(out, NOBODY.pw_uid, NOBODY.pw_gid)
        # A shape's sample closes after `window` (default 120 s): here at the read after its first.
        inspector = {"dir": str(node.base), "interval": 1, "grace": 2, "window": 1}
        # The node's daemon, paused by the prolog as on a real node: it reads the jobs anyway.
        pause = {"pause_file": str(node.pause), "pause_dir": str(node.pause.parent / "pause.d")}
        config = fast_config(tmp_path, inspector=inspector, **pause)
        (node.base / MARKER).touch()  # the site's setup: the daemon starts before any prolog
        daemon = DaemonProcess(tmp_path, config)
        try:
            with SlurmCluster(nodes=1, settings=settings) as cluster:
                _job_dumps_and_goes(cluster, daemon, node, stage, job_script, out)
        finally:
            daemon.stop()


def _job_dumps_and_goes(
    cluster: SlurmCluster, daemon: DaemonProcess, node: Node, stage: Path, job: Path, out: Path
) -> None:
    def submit(release: Path, export: str = "NONE") -> str:
        # Not this process's environment (sbatch's default): NCCL_* of its own would show.
        return cluster.sbatch(
            "--uid=nobody",
            "--gid=nogroup",
            f"--chdir={out}",
            f"--output={out}/%j.out",
            f"--export={export}",
            str(job),
            str(stage),
            str(release),
        )

    def removed() -> float:
        return daemon.value("netmon_jobs_directories_removed_total") or 0.0

    release = out / "release"
    job_id = submit(release)
    job_dir = node.job_dir(job_id)
    dumps = sorted(p.name for p in stage.iterdir())
    assert len(dumps) == 8
    # The job ran as nobody, in nobody's directory, with the five variables naming it.
    wait_until(
        lambda: job_dir.is_dir() and sorted(p.name for p in job_dir.iterdir()) == dumps,
        30,
        f"the job's dumps in {job_dir} ({cluster.job_state(job_id)})\n{cluster.logs()}",
    )
    assert not job_dir.is_symlink()
    assert _owner_and_mode(job_dir) == (NOBODY.pw_uid, NOBODY.pw_gid, 0o700)
    assert {_owner_and_mode(p)[0] for p in job_dir.iterdir()} == {NOBODY.pw_uid}
    printed = (out / f"{job_id}.out").read_text().splitlines()
    wanted = sorted(line.removeprefix("export ") for line in node.exports(job_id))
    assert printed == wanted

    # The daemon read them while the job runs (and pauses its probes): collectives within the
    # node, and their shapes.
    assert daemon.value("netmon_paused") == 1
    wait_until(
        lambda: (daemon.value("netmon_jobs_collectives_total", path="node") or 0) > 0,
        15,
        f"the daemon to read the job's dumps\n{daemon.log()[-3000:]}",
    )
    assert (daemon.value("netmon_jobs_collectives_total", path="nodes") or 0) > 0
    # The tensor-parallel all_reduce over the node's 8 GPUs, as its dump said (150 GB/s).
    shape = {"probe": "jobs", "op": "all_reduce", "path": "node", "ranks": "8"}
    busbw = wait_until(
        lambda: daemon.value_with("netmon_busbw_bytes_per_second", **shape),
        10,
        f"the series {shape}",
    )
    assert busbw == pytest.approx(150e9, rel=0.01)
    assert removed() == 0 and job_dir.is_dir(), "a running job's directory stays"

    release.touch()
    wait_until(lambda: cluster.job_state(job_id) == "COMPLETED", 30, "the job to end")
    wait_until(lambda: not job_dir.exists(), 15, f"netmon to remove {job_dir}")
    wait_until(lambda: removed() == 1, 5, "netmon_jobs_directories_removed_total 1")
    assert daemon.value("netmon_paused") == 0

    # A job that picked its own profiler plugin gets none of ours; its directory goes all the same.
    own = submit(out / "release-own", "NCCL_PROFILER_PLUGIN=/opt/mine.so")
    (out / "release-own").touch()
    wait_until(lambda: cluster.job_state(own) == "COMPLETED", 30, "the second job to end")
    assert (out / f"{own}.out").read_text().splitlines() == ["NCCL_PROFILER_PLUGIN=/opt/mine.so"]
    wait_until(lambda: removed() == 2, 15, "netmon to remove the second job's directory")
    assert not node.job_dir(own).exists()
    assert daemon.value("netmon_jobs_rejected_total", reason="symlink") == 0
