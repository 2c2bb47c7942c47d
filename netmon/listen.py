"""Listening sockets bound to one address: the member port's store (netmon.group.store) and
the rendezvous stores of probes, handed to torch's TCPStore by file descriptor; and the warning
for a /metrics that anyone on the node's own network can read.

TCPStore binds every address of the host when it listens by itself, which would put a store that
authenticates nobody on every network the node has. Binding the socket first and passing it as
`master_listen_fd` keeps a store on the one address its peers use.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

BACKLOG = 128


def listen_on(host: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on `host` (a name or an address) and `port` (0: any free one)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        # A restarted daemon takes its member port back while old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def is_loopback_host(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def shares_pid1_network(proc: Path = Path("/proc")) -> bool:
    """Whether this process is in PID 1's network namespace: on the host itself, or in a container
    on the node's network that sees the host's processes (hostNetwork with hostPID, as netmon's
    DaemonSets run). A container with a PID namespace of its own sees its own PID 1, so it says
    true there too. False where PID 1's namespace cannot be read (another user's)."""
    try:
        ours, first = os.stat(proc / "self" / "ns" / "net"), os.stat(proc / "1" / "ns" / "net")
    except OSError:
        return False
    return (ours.st_dev, ours.st_ino) == (first.st_dev, first.st_ino)


def exposure_warning(host: str, port: int, authenticated: bool, host_network: bool) -> str | None:
    """The warning for /metrics on a non-loopback address of the host's network without
    credentials (basic auth or client certificates), or None."""
    if authenticated or not host_network or is_loopback_host(host):
        return None
    where = "every address of this node" if host in ("", "0.0.0.0", "::", "[::]") else host
    return (
        f"listen: /metrics on {where} (port {port}) without authentication, in PID 1's network "
        "namespace (the node's own, unless in a container of its own): whoever reaches it reads "
        "this node's metrics. Set --web-config with basic_auth_users and tls_server_config, or "
        'listen on 127.0.0.1 (docs/SECURITY.md, "Deployment defaults")'
    )
