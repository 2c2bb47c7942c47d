"""The NCCL_DEBUG settings of a rank: what netmon adds so that NCCL's log shows the transports it
chose (parsed by netmon.probe.nccl_debug), an operator's own settings left as they are.

Pure: the launcher passes the environment a rank will get (docs/FACTS.md, "Transport log").
"""

from __future__ import annotations

from collections.abc import Mapping

# The subsystems netmon asks for when the operator chose no log level: those of the lines
# netmon.probe.nccl_debug.parse reads, and no more. INIT tags every connection ("via") line
# together with its transport's own P2P, SHM or NET, and the communicator, rank and NVLS lines;
# ENV the variables set (src/misc/param.cc). The version banner and WARN lines carry every
# subsystem. Nothing reads GRAPH (the topology search's Pattern, Ring and Tree lines) or TUNING,
# and TUNING costs: since 2.20 rank 0 logs every collective's algorithm under it (src/enqueue.cc)
# to a file NCCL leaves unbuffered (line-buffered since 2.27, src/debug.cc), so one write() per
# operation inside the timed loop, which shows at small sizes.
DEBUG_SUBSYS = "INIT,ENV"
# The NCCL_DEBUG levels that print INFO lines. A level prints every line up to its own, in the
# order VERSION, WARN, INFO, ABORT, TRACE (src/debug.cc).
_INFO_LEVELS = ("INFO", "ABORT", "TRACE")
# NCCL's subsystems when NCCL_DEBUG_SUBSYS is unset (src/debug.cc).
_DEFAULT_SUBSYS = "INIT,BOOTSTRAP,ENV"


def logs_transports(level: str | None, subsys: str | None) -> bool:
    """Whether NCCL at this NCCL_DEBUG and NCCL_DEBUG_SUBSYS writes every line the transports are
    read from.

    Every "via" line, the communicator line and the NVLS lines carry the INIT subsystem (a
    transport's lines carry its own too), so INFO with INIT is complete; anything less would show
    some transports and hide others. NCCL compares names without case, and a leading ^ excludes
    the names listed instead (src/debug.cc).
    """
    if level is None or level.upper() not in _INFO_LEVELS:
        return False
    listed = _DEFAULT_SUBSYS if subsys is None else subsys
    excluded = listed.startswith("^")
    names = {name.strip().upper() for name in listed.removeprefix("^").split(",")}
    init = bool(names & {"INIT", "ALL"})
    return not init if excluded else init


def debug_env(env: Mapping[str, str], log_file: str) -> dict[str, str]:
    """What to add to a rank's environment `env` (the operator's settings, as the rank will get
    them) so that NCCL writes its transports to `log_file`; nothing where that cannot be.

    The operator's NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE are kept as they are: netmon
    fills in only what was left unset, INFO with its own subsystems when no level was chosen, and
    its file when none was named and the log will be complete (`logs_transports`). A log netmon
    cannot read is not redirected at all, so no file of netmon's exists, the transports stay
    unknown and nothing is judged. An operator's own file is theirs: netmon does not look for it.
    """
    if env.get("NCCL_DEBUG_FILE"):  # empty: NCCL writes to stdout, as when it is unset
        return {}
    added: dict[str, str] = {}
    if "NCCL_DEBUG" not in env:
        added["NCCL_DEBUG"] = "INFO"
        if "NCCL_DEBUG_SUBSYS" not in env:
            added["NCCL_DEBUG_SUBSYS"] = DEBUG_SUBSYS
    wanted = {**env, **added}
    if not logs_transports(wanted.get("NCCL_DEBUG"), wanted.get("NCCL_DEBUG_SUBSYS")):
        # Not even the level is raised: the operator's subsystems leave the log partial, and
        # NCCL writes to the rank's stdout, which goes to its stderr file (the launcher's channel
        # is a descriptor of its own), and nothing is judged.
        return {}
    return {**added, "NCCL_DEBUG_FILE": log_file}
