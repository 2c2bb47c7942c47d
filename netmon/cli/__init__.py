"""The `netmon` command: one module per subcommand; flags, tables and exit codes, nothing else.

Exit codes: 0 success; 1 a health gate failed (busbw under --min-busbw, a suspect pair); 2 a
usage or configuration error (one line on stderr, no traceback); 3 a probe failed to complete.
"""

EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_PROBE_FAILED = 0, 1, 2, 3
