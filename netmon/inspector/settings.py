"""The `inspector:` section of netmon.yaml: where the jobs' NCCL Inspector files lie, how often
they are read and what the daemon keeps of them (docs/INSPECTOR.md)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netmon.bandwidth import parse_duration, parse_size
from netmon.schema import DURATION_TEXT, SIZE_TEXT, also

# Where `dir` may lie: strictly below one of these roots, in plain components (no "." or ".."),
# so that neither "/" nor a system or home directory can be named, even by a typo. The job
# directories are removed once ended (netmon.inspector.jobdirs says which); the Helm chart's
# schema takes the same pattern (netmon check-config --schema).
DIR_ROOTS = ("/run", "/var/run", "/var/lib", "/var/spool", "/var/tmp", "/tmp", "/scratch", "/srv")
# A component is anything but "." and ".." (no lookahead: the chart's schema is checked by Helm,
# whose Go regexp has none).
_COMPONENT = r"(?:[^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
DIR_PATTERN = "^/(?:" + "|".join(r.removeprefix("/") for r in DIR_ROOTS) + f")(?:/{_COMPONENT})+$"
_DIR = re.compile(DIR_PATTERN)
MIB = 1 << 20


class InspectorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Each job's dump directory lies under it: NCCL_INSPECTOR_DUMP_DIR=<dir>/<job>, set by the
    # site's Slurm TaskProlog (deploy/slurm) or the pod's environment (Kubernetes).
    dir: Path = Field(json_schema_extra={"pattern": DIR_PATTERN})
    # How often the files are read: the plugin's own dump interval (30 s in its textfile mode).
    interval: float = Field(30.0, ge=1.0, le=3600.0, json_schema_extra=also(DURATION_TEXT))
    # A job directory is removed once its `.ended` mark (the Slurm Epilog's) is this old, so
    # the job's last dump is read first ...
    grace: float = Field(120.0, ge=0.0, json_schema_extra=also(DURATION_TEXT))
    # ... or, with no mark (Kubernetes), once nothing in it changed for this long.
    stale_after: float = Field(6 * 3600.0, ge=60.0, json_schema_extra=also(DURATION_TEXT))
    # The most of one file read per interval: a textfile dump is a few kB per communicator; the
    # JSON lines files grow for the life of a job and are read from where the last read ended.
    max_read_bytes: int = Field(4 * MIB, ge=4096, le=64 * MIB, json_schema_extra=also(SIZE_TEXT))
    # One read as a whole, across every job and file: this many bytes and seconds at most (the
    # time is checked between files, so one file may overrun it). The jobs are taken in turn,
    # from where the last read stopped; what is left waits for the next read (counted as
    # netmon_jobs_rejected{reason="budget_exhausted"}).
    read_budget_bytes: int = Field(
        64 * MIB, ge=4096, le=1024 * MIB, json_schema_extra=also(SIZE_TEXT)
    )
    read_budget_seconds: float = Field(2.0, ge=0.1, le=60.0, json_schema_extra=also(DURATION_TEXT))
    # A line longer than this is not a line the plugin writes (its labels are short).
    max_line_bytes: int = Field(4096, ge=256, le=1 << 20, json_schema_extra=also(SIZE_TEXT))
    # Files and job directories looked at per read; more are counted and left for the next.
    max_files: int = Field(256, ge=1, le=65536)
    # Shapes (collective, size bucket, ranks, node or nodes) exported and judged; a shape past
    # the cap is counted (netmon_jobs_shape_overflow_total), never exported. A judged shape is
    # some 24 series (busbw, baseline, reference, verdict and its reasons), an unjudged one 8:
    # six shapes and the reading's own counts stay under 200 (docs/METRICS.md, "Jobs families").
    max_shapes: int = Field(6, ge=1, le=64)
    # An exported shape that saw no collective for this long leaves /metrics, making room (a
    # job's start-up collectives, say, for the shapes it trains with).
    shape_idle: float = Field(900.0, ge=60.0, json_schema_extra=also(DURATION_TEXT))
    # A shape's sample is taken over this long (several dumps: the plugin writes one collective
    # per communicator and rank per dump; netmon.inspector.shapes), and needs this many.
    window: float = Field(120.0, ge=1.0, le=3600.0, json_schema_extra=also(DURATION_TEXT))
    min_collectives: int = Field(3, ge=1)

    @field_validator(
        "interval",
        "grace",
        "stale_after",
        "shape_idle",
        "window",
        "read_budget_seconds",
        mode="before",
    )
    @classmethod
    def _duration(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, (str, int, float)) else value

    @field_validator("max_read_bytes", "max_line_bytes", "read_budget_bytes", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value

    @field_validator("dir", mode="before")
    @classmethod
    def _dir(cls, value: object) -> object:
        # On the text as written: Path() would fold "//" and a trailing "/" away.
        text = str(value) if isinstance(value, (str, Path)) else value
        if isinstance(text, str) and _DIR.fullmatch(text) is None:
            raise ValueError(
                f"must be a directory below one of {', '.join(DIR_ROOTS)} made for NCCL "
                "Inspector, in plain components: netmon removes the ended jobs' directories in "
                "it; e.g. /var/lib/netmon-inspector"
            )
        return value

    @model_validator(mode="after")
    def _absolute(self) -> InspectorConfig:
        if self.read_budget_bytes < self.max_read_bytes:
            raise ValueError(
                f"read_budget_bytes ({self.read_budget_bytes}) must be >= max_read_bytes "
                f"({self.max_read_bytes}): a read takes at least one file"
            )
        if self.window < self.interval:
            raise ValueError(
                f"window ({self.window:g} s) must be >= interval ({self.interval:g} s): a sample "
                "spans at least one read"
            )
        return self
