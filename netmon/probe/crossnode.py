"""The network between nodes: what a node group's `transport` asks of NCCL's log, and the group
round or node pair that fails as `transport_mismatch` when NCCL carried it on another network.

Pure: a parsed NCCL_DEBUG=INFO report (netmon.probe.nccl_debug) and an outcome in, values out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netmon.probe.spec import ProbeFailure, ProbeOutcome

if TYPE_CHECKING:
    from netmon.probe.nccl_debug import Intent, TransportClass, TransportReport

# The reasons `judge_network` gives (counted in netmon_transport_mismatch_total); each one means
# the round measured another network than the group declares.
NET_REASONS: tuple[str, ...] = (
    "socket_where_ib_expected",
    "plugin_where_ib_expected",
    "ib_where_socket_expected",
    "plugin_where_socket_expected",
    "socket_where_net_expected",
    "no_net_between_nodes",
)
# The intent of a node group's `transport` (netmon.group.members): what its rounds' logs must show.
INTENT_OF_TRANSPORT: dict[str, Intent] = {
    "ib": "net_ib",
    "socket": "net_socket",
    "net": "net",
    "any": "any",
}
_NET_CLASSES: frozenset[TransportClass] = frozenset({"net_ib", "net_socket", "net_other"})
# Per network intent: the network transport classes it refuses, and the reason each one gives.
_REFUSED: dict[str, dict[TransportClass, str]] = {
    "net_ib": {
        "net_socket": "socket_where_ib_expected",
        "net_other": "plugin_where_ib_expected",
    },
    "net_socket": {
        "net_ib": "ib_where_socket_expected",
        "net_other": "plugin_where_socket_expected",
    },
    "net": {"net_socket": "socket_where_net_expected"},
}


def network_reasons(intent: Intent) -> tuple[str, ...]:
    """The reasons `judge_network` can give for this intent: none unless it is a network one."""
    refused = _REFUSED.get(intent)
    return () if refused is None else (*refused.values(), "no_net_between_nodes")


def network_transports(report: TransportReport) -> frozenset[TransportClass]:
    """The network transports of connections not known to stay inside one node.

    A rank's log seldom places the far end of a NET line on a host, so a NET connection counts as
    one between nodes unless both ends are known to share a host (NET inside a node needs P2P and
    SHM both off).
    """
    return frozenset(
        c.transport
        for c in report.connections
        if c.transport in _NET_CLASSES and c.locality != "intra_node"
    )


def judge_network(report: TransportReport, intent: Intent) -> list[str]:
    """The ways the traffic between nodes contradicts a network intent; each one of NET_REASONS.

    "net_ib": NCCL's InfiniBand verbs transport (NET/IB, which carries RoCE too; IBext is the
    SHARP plugin's name for the same path). "net_socket": its TCP socket transport (NET/Socket).
    "net": any network transport but sockets (IB verbs or a net plugin such as AWS Libfabric).
    Other intents, and a log without connection lines (gloo, NCCL_DEBUG set by the probe, a run
    that never connected), yield nothing. A communicator over several nodes with no network
    connection at all (a multi-node NVLink domain) is `no_net_between_nodes`.
    """
    refused = _REFUSED.get(intent)
    if refused is None or not report.observed:
        return []
    used = network_transports(report)
    if not used:
        return ["no_net_between_nodes"] if (report.n_nodes or 0) > 1 else []
    return [reason for transport, reason in refused.items() if transport in used]


def transport_checked(outcome: ProbeOutcome) -> ProbeOutcome:
    """The outcome, failed as `transport_mismatch` when its log showed another network between
    nodes than its intent: its busbw measured the wrong network, so it must neither feed a
    baseline nor be exported (netmon.serve.results learns only from outcomes without a failure).
    A run that failed keeps its own failure; one whose log could not be read has no such fault."""
    wrong = [reason for reason in outcome.transport_faults if reason in NET_REASONS]
    if outcome.failure is not None or not wrong:
        return outcome
    failure = ProbeFailure(
        phase="init",  # NCCL picks its network when the communicator is created (ncclNetInit)
        rank=None,
        cause="transport_mismatch",
        detail=(
            f"{outcome.spec.intent} expected between nodes, NCCL's log shows "
            f"{', '.join(outcome.transports) or 'no transport'}: {', '.join(wrong)}"
        ),
    )
    return outcome.model_copy(update={"failure": failure})
