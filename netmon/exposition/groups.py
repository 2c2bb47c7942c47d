"""The node group families: node pairs this member measured, the verdicts it judged while it led
the group (flags, streaks and their age), and the group as this member sees it."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from netmon.exposition.families import family
from netmon.exposition.snapshot import Snapshot
from netmon.group.signing import REFUSALS
from netmon.group.store import REASONS


def group_families(snapshot: Snapshot) -> Iterator[Metric]:
    peer_busbw = family("netmon_peer_busbw_bytes_per_second", snapshot)
    for point in snapshot.peers:
        peer_busbw.add_metric([point.probe, str(point.size_bytes), point.peer], point.busbw)
    yield peer_busbw
    yield from _peer_verdict_families(snapshot)
    view = snapshot.group
    if view is None:
        return
    members = family("netmon_group_members", snapshot)
    members.add_metric([view.name], float(len(view.seen)))
    up = family("netmon_group_member_up", snapshot)
    for member in view.members:
        up.add_metric([view.name, member], 1.0 if member in view.seen else 0.0)
    leader = family("netmon_group_leader", snapshot)
    if view.leader is not None:
        leader.add_metric([view.name, view.leader], 1.0)
    rejected = family("netmon_group_messages_rejected", snapshot)
    for member in view.members:
        rejected.add_metric([view.name, member], float(snapshot.group_rejected.get(member, 0)))
    store_refused = family("netmon_group_store_refused", snapshot)
    for reason in REASONS:
        count = snapshot.group_store_refused.get(reason, 0)
        store_refused.add_metric([view.name, reason], float(count))
    results_refused = family("netmon_group_results_refused", snapshot)
    for member in view.members:
        for reason in REFUSALS:
            count = snapshot.group_results_refused.get((member, reason), 0)
            results_refused.add_metric([view.name, member, reason], float(count))
    yield from (members, up, leader, rejected, store_refused, results_refused)


def _peer_verdict_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The leader's verdicts: each member's and node pair's flag, its streak, and when a sweep
    last measured it (the streak and time only of those measured since this node last took the
    lead)."""
    names = (
        "netmon_peer_suspect",
        "netmon_peer_suspect_sweeps",
        "netmon_peer_measurement_timestamp_seconds",
        "netmon_peer_link_suspect",
        "netmon_peer_link_suspect_sweeps",
        "netmon_peer_link_measurement_timestamp_seconds",
    )
    families = [family(name, snapshot) for name in names]
    suspect, in_a_row, measured, pair, pair_in_a_row, pair_measured = families
    for probe, verdict in sorted(snapshot.peer_verdicts.items()):
        for member in verdict.members:
            streak = verdict.streaks.get(member)
            suspect.add_metric([probe, member], 1.0 if member in verdict.suspects else 0.0)
            in_a_row.add_metric([probe, member], float(streak.sweeps) if streak else 0.0)
            if streak is not None:
                measured.add_metric([probe, member], streak.measured_at)
        for a, b in verdict.pair_suspects:
            pair.add_metric([probe, a, b], 1.0)
        for (a, b), streak in sorted(verdict.pair_streaks.items()):
            pair_in_a_row.add_metric([probe, a, b], float(streak.sweeps))
            pair_measured.add_metric([probe, a, b], streak.measured_at)
    yield from families
