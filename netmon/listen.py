"""Listening sockets bound to one address, handed to torch's TCPStore by file descriptor.

TCPStore binds every address of the host when it listens by itself, which would put a store that
authenticates nobody on every network the node has. Binding the socket first and passing it as
`master_listen_fd` keeps a store on the one address its peers use.
"""

from __future__ import annotations

import socket

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
