"""Node groups: who the members are and how a round's world is laid out (members), sealing every
message with the group's secret (auth), the store agent process (agent) and the daemon's handle on
it (link). The rounds themselves are run by netmon.serve.coordinator."""
