"""NCCL Inspector's output, written the way the plugin's source writes it (NCCL v2.29.3-1,
ext-profiler/inspector: inspector_prom.cc for the textfile dumps, inspector.cc and json.cc for
JSON lines; tests/fixtures/SOURCES.md). Only the test side writes these; netmon reads them.

Textfile mode: one `nccl_inspector_metrics_<uuid>.prom` per GPU, rewritten in place each dump
with three lines per communicator that completed a collective since the last dump (its latest):
labels in the plugin's order, values as "%.6g", no HELP or TYPE. JSON mode: `<host>-pid<pid>.log`
per process, one compact object per communicator per dump, doubles as "%lf".
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

GIT_REV = "v2.29.3-1-0-g0000000"
MARKER = ".netmon-inspector"  # the site's mark of a directory made for netmon (jobdirs.MARKER)
# inspectorComputeCollBw: the traffic over which algbw is taken, and busbw's factor.
_TRAFFIC_PER_RANK = ("AllGather", "ReduceScatter")


@dataclass(frozen=True)
class Comm:
    """One communicator as this node sees it: its ranks on this node's GPUs."""

    comm_id: int
    coll: str  # ncclFuncToString: AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, ...
    message_bytes: int  # one rank's count x type size
    nranks: int
    nnodes: int
    gpus: tuple[int, ...]  # this node's GPUs in it
    first_rank: int = 0  # the rank of gpus[0]

    def factor(self) -> float:
        n = self.nranks
        if self.coll == "AllReduce":
            return 2.0 * (n - 1) / n
        if self.coll in _TRAFFIC_PER_RANK:
            return (n - 1) / n
        return 1.0

    def traffic(self) -> int:
        per_rank = self.coll in _TRAFFIC_PER_RANK
        return self.message_bytes * self.nranks if per_rank else self.message_bytes

    def timing(self, busbw_gbs: float) -> tuple[int, float, float]:
        """(exec time in us, algbw, busbw) as the plugin derives them from the time."""
        algbw_wanted = busbw_gbs / self.factor()
        exec_us = max(1, round(self.traffic() / 1e9 / algbw_wanted * 1e6))
        algbw = self.traffic() / 1.0e9 / (exec_us / 1e6)
        return exec_us, algbw, algbw * self.factor()


def marked_root(root: Path) -> Path:
    """`inspector.dir` as the site's setup makes it: a directory holding netmon's marker."""
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).touch()
    return root


def uuid_of(gpu: int) -> str:
    # inspector.cc: "%02x%02x%02x%02x-%02x%02x-..." of the device's UUID bytes, no "GPU-".
    raw = bytes([0xA1, 0x52, 0x3C, gpu, 0x11, 0x22, 0x33, 0x44, *range(8)])
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def message_size(size: int) -> str:
    """inspector_prom.cc's formatter: binary units, two decimals, bytes as an integer."""
    units = ("B", "KB", "MB", "GB", "TB")
    value, unit = float(size), 0
    while value >= 1024.0 and unit < 4:
        value /= 1024.0
        unit += 1
    return f"{size}B" if unit == 0 else f"{value:.2f}{units[unit]}"


def _labels(comm: Comm, gpu_index: int, host: str, job: str, sn: int, at: float) -> str:
    static = (
        f'comm_id="0x{comm.comm_id:x}",hostname="{host}",rank="{comm.first_rank + gpu_index}",'
        f'slurm_job="train",slurm_job_id="{job}",nranks="{comm.nranks}",'
        f'n_nodes="{comm.nnodes}",gpu_device_id="GPU{comm.gpus[gpu_index]}"'
    )
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    return (
        f'{static},collective="{comm.coll}",coll_sn="{sn}",timestamp="{stamp}",'
        f'message_size="{message_size(comm.message_bytes)}"'
    )


BusbwOf = Callable[[Comm, int], float]  # (comm, gpu) -> busbw in GB/s


def job_uid(job: str) -> int:
    """The uid of a job's user: one user a job directory unless a test says otherwise, as on a
    cluster where every job is a user's. netmon takes a file's owner as whose word a record is."""
    return 20000 + zlib.crc32(job.encode()) % 20000


def _own(path: Path, owner: int | None) -> None:
    uid = job_uid(path.parent.name) if owner is None else owner
    os.chown(path.parent, uid, -1)  # as the Slurm prolog (root) gives the job's user its directory
    os.chown(path, uid, -1)


def prom_dump(
    directory: Path,
    comms: Sequence[Comm],
    busbw_of: BusbwOf,
    at: float,
    sn: int,
    host: str = "node1",
    job: str = "4242",
    owner: int | None = None,
) -> list[Path]:
    """One dump of every GPU's file at time `at` (its mtime too, as if written then)."""
    directory.mkdir(parents=True, exist_ok=True)
    gpus = sorted({g for c in comms for g in c.gpus})
    written = []
    for gpu in gpus:
        lines = []
        for comm in comms:
            if gpu not in comm.gpus:
                continue
            index = comm.gpus.index(gpu)
            exec_us, algbw, busbw = comm.timing(busbw_of(comm, gpu))
            labels = _labels(comm, index, host, job, sn, at)
            lines += [
                f"nccl_algorithm_bandwidth_gbs{{{labels}}} {algbw:.6g}\n",
                f"nccl_bus_bandwidth_gbs{{{labels}}} {busbw:.6g}\n",
                f"nccl_collective_exec_time_microseconds{{{labels}}} {float(exec_us):.6g}\n",
            ]
        path = directory / f"nccl_inspector_metrics_{uuid_of(gpu)}.prom"
        with open(path, "w") as out:  # fopen(..., "w"): in place, not renamed
            out.write("".join(lines))
        _own(path, owner)
        os.utime(path, ns=(int(at * 1e9), int(at * 1e9)))
        written.append(path)
    return written


def json_record(
    comm: Comm, gpu: int, busbw_gbs: float, at: float, sn: int, host: str, pid: int
) -> str:
    exec_us, algbw, busbw = comm.timing(busbw_gbs)
    index = comm.gpus.index(gpu)
    # As json.cc prints it: printf-style, so "%f" is C's "%lf" (six decimals).
    record = (
        '{"header":{"id":"0x%x","rank":%d,"n_ranks":%d,"nnodes":%d},'  # noqa: UP031
        '"metadata":{"inspector_output_format_version":"v4.0","git_rev":%s,'
        '"rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":%d,"hostname":%s,'
        '"pid":%d},'
        '"coll_perf":{"coll":"%s","coll_sn":%d,"coll_msg_size_bytes":%d,'
        '"coll_exec_time_us":%d,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":%f,'
        '"coll_busbw_gbs":%f}}'
    ) % (
        comm.comm_id,
        comm.first_rank + index,
        comm.nranks,
        comm.nnodes,
        json.dumps(GIT_REV),
        int(at * 1e6),
        json.dumps(host),
        pid,
        comm.coll,
        sn,
        comm.message_bytes,
        exec_us,
        algbw,
        busbw,
    )
    return record + "\n"


def json_dump(
    directory: Path,
    comms: Sequence[Comm],
    busbw_of: BusbwOf,
    at: float,
    sn: int,
    host: str = "node1",
    pid: int = 4100,
    owner: int | None = None,
) -> Path:
    """One dump of one process (all this node's GPUs in it), appended to its file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{host}-pid{pid}.log"
    lines = [
        json_record(comm, gpu, busbw_of(comm, gpu), at, sn, host, pid)
        for comm in comms
        for gpu in comm.gpus
    ]
    with open(path, "a") as out:
        out.write("".join(lines))
    _own(path, owner)
    return path


def training_comms(gpus: int = 8, nodes: int = 4) -> list[Comm]:
    """16 communicators of a 3D-parallel job on an 8-GPU node: a tensor-parallel group over the
    node's 8 GPUs and four pairs inside it, a data-parallel group per GPU across `nodes` nodes,
    and three groups over halves and the whole node (an expert and a pipeline stage's)."""
    node = tuple(range(gpus))
    comms = [Comm(0x7F3A00, "AllReduce", 64 << 20, gpus, 1, node)]
    comms += [
        Comm(0x7F3B00 + k, "AllGather", 8 << 20, 2, 1, (2 * k, 2 * k + 1), 0)
        for k in range(gpus // 2)
    ]
    comms += [
        Comm(0x7E0000 + g, "ReduceScatter", 128 << 20, nodes, nodes, (g,), 0) for g in range(gpus)
    ]
    comms += [
        Comm(0x7D0001, "AllReduce", 1 << 20, gpus // 2, 1, node[: gpus // 2]),
        Comm(0x7D0002, "AllReduce", 1 << 20, gpus // 2, 1, node[gpus // 2 :]),
        Comm(0x7D0003, "Broadcast", 4 << 20, gpus, 1, node),
    ]
    return comms
