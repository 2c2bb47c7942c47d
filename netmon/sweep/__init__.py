"""Cluster sweeps: node pairs measured through the scheduler from idle capacity, judged against
their cohort and each end's history, and the bad end named in a second round (docs/SWEEPS.md).

Planning (plan.py) and judging (judge.py, localise.py) are pure functions; the scheduler sits
behind one small interface (scheduler.py) with Slurm (slurm.py) as its first implementation;
rank.py is what a pair's job runs on each node; the nodes' own daemons export the results
(node_report.py is what they receive).
"""
