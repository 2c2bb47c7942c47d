"""The selftest's look at the jobs' NCCL Inspector output (`inspector:`): what this project could
not check without a GPU and the plugin is whether a real dump reads as netmon expects it
(docs/INSPECTOR.md, "What was not checked here"). Reads once, removes nothing."""

from __future__ import annotations

import time

from netmon.inspector.files import DumpReader, Reading
from netmon.inspector.settings import InspectorConfig
from netmon.selftest.checks import Row

CHECK = "inspector"
# Reasons that say the plugin writes something else than netmon reads; the others are about
# files (a symlink, a dump rewritten while read) and say nothing about the format.
FORMAT_REASONS = ("unparsable", "incomplete", "unknown_collective", "bad_value", "oversized_line")


def inspector_row(settings: InspectorConfig | None) -> Row:
    if settings is None:
        return Row(CHECK, "jobs' files", "SKIP", detail="no `inspector:` in the configuration")
    return judge(settings, DumpReader(settings, remove=False).read(time.time()))


def judge(settings: InspectorConfig, reading: Reading) -> Row:
    wrong = {r: n for r, n in sorted(reading.rejected.items()) if r in FORMAT_REASONS}
    figures = {
        "files": reading.files,
        "collectives": len(reading.collectives),
        "rejected": dict(reading.rejected),
    }
    measured = f"{len(reading.collectives)} collectives in {reading.files} files"
    goal = "every line of a real dump read"
    if wrong:
        detail = ", ".join(f"{n} x {r}" for r, n in wrong.items())
        return Row(
            CHECK,
            "jobs' files",
            "FAIL",
            measured,
            goal,
            f"{detail} under {settings.dir}: the plugin writes another format than netmon reads; "
            "please report it with one dump (docs/INSPECTOR.md)",
            figures,
        )
    if not reading.collectives:
        return Row(
            CHECK,
            "jobs' files",
            "SKIP",
            measured,
            goal,
            f"no job's Inspector output under {settings.dir} yet: run it again while a job "
            "with the plugin runs on this node",
            figures,
        )
    ops = sorted({f"{c.op} x{c.ranks}" for c in reading.collectives})
    return Row(CHECK, "jobs' files", "PASS", measured, goal, ", ".join(ops[:8]), figures)
