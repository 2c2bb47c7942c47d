"""The `netmon` command: one module per subcommand; flags, tables and exit codes, nothing else.

One exit-code table for every command (EXIT_CODES, printed by `netmon --help`).
"""

EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_COULD_NOT_RUN, EXIT_UNDECIDED = 0, 1, 2, 3, 4
EXIT_PROBE_FAILED = EXIT_COULD_NOT_RUN  # a probe that could not finish could not run
EXIT_READER_GONE = 128 + 13  # 141: as a shell shows a process that SIGPIPE killed

EXIT_CODES = (
    (EXIT_OK, "ok (healthy; the command did what it was asked)"),
    (
        EXIT_GATE,
        "unhealthy: busbw under --min-busbw, a selftest check failed, a sweep named a suspect",
    ),
    (EXIT_USAGE, "a usage or configuration error: one line naming the flag or setting"),
    (
        EXIT_COULD_NOT_RUN,
        "could not run here: no usable GPU for --backend nccl (or NVML for topo), a probe that "
        "could not finish, a selftest stopped early, a sweep without its scheduler",
    ),
    (EXIT_UNDECIDED, "netmon sweep: a failure it could neither name nor clear"),
    (
        EXIT_READER_GONE,
        "the output's reader went away (| head) before a gate's verdict, as a shell shows a "
        "process SIGPIPE killed; replay, check-config and topo exit 0 then",
    ),
)


def textfile_warning(path: object) -> str | None:
    """The warning a --textfile PATH gets where node_exporter's textfile collector would never
    read it: the collector takes only files named *.prom (node_exporter's README, "Textfile
    Collector"). Written anyway: another reader may want that name."""
    name = str(path)
    if name.endswith(".prom"):
        return None
    return (
        f"netmon: warning: --textfile {name}: node_exporter's textfile collector reads only "
        "files ending in .prom; written anyway"
    )
