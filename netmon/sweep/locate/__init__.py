"""The planner and the judge, pure: node classes, the fabric, each round's pairs, the verdict
on each pair's rails, and the state machine that names a node, a path, an uplink or a switch."""
