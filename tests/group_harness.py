"""A node group's store agent on loopback, started and stopped for a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from netmon.group.link import GroupLink
from tests.prometheus_harness import free_port

SECRET = b"0123456789abcdef0123456789abcdef"  # the group's shared secret (>= 16 bytes)


@contextmanager
def store_agent(secret: bytes = SECRET) -> Iterator[GroupLink]:
    """A real store agent on a free loopback port, reached as that member."""
    member = f"127.0.0.1:{free_port()}"
    link = GroupLink(int(member.rpartition(":")[2]), "127.0.0.1", member, secret=secret)
    link.start()
    try:
        yield link
    finally:
        link.stop()
