"""`netmon serve`: the daemon's lifecycle (daemon), the running configuration (current), the one
readiness decision (readiness), a scheduled run (runner), group rounds (coordinator, rounds,
node_pairs) and the record of results that becomes each snapshot (results)."""
