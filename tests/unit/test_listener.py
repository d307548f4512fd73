"""The api's listening socket for several api processes on one port (`up --apis N`)."""

from __future__ import annotations

import socket

import pytest

from switchboard.supervisor.listener import bind_listener, check_free

pytestmark = pytest.mark.unit


def test_reuse_port_sockets_share_a_port_and_a_plain_bind_is_refused() -> None:
    """Two SO_REUSEPORT listeners share a port; the check (a plain bind) then fails, so a
    second `up` would not join them; once they are closed the port is free again."""
    first = bind_listener("127.0.0.1", 0, reuse_port=True)
    port = first.getsockname()[1]
    second = bind_listener("127.0.0.1", port, reuse_port=True)
    try:
        with pytest.raises(OSError):
            check_free("127.0.0.1", port)
        with pytest.raises(OSError):
            bind_listener("127.0.0.1", port)
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    finally:
        first.close()
        second.close()
    check_free("127.0.0.1", port)


def test_a_port_held_without_reuse_port_is_not_free() -> None:
    """A port another program listens on is refused, and SO_REUSEPORT cannot join it."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(OSError):
            check_free("127.0.0.1", port)
        with pytest.raises(OSError):
            bind_listener("127.0.0.1", port, reuse_port=True)
