"""The api's listening socket when several api processes serve one port (`switchboard up
--apis N`).

Each `switchboard api --reuse-port` binds the port itself with SO_REUSEPORT, and the
kernel spreads new connections over the processes' sockets by a hash of each connection's
addresses, so every process gets its share even when one is idle and fast to accept (a
single socket shared by the processes would hand a burst to whichever woke first).
Sockets join only a group of the same user's SO_REUSEPORT sockets: `up` checks the port
is free first (`check_free`), so a port held by anything else, another `up` included, is
refused at start, never shared.
"""

from __future__ import annotations

import socket

# As uvicorn's own default backlog.
BACKLOG = 2048


def _address(host: str, port: int) -> tuple[int, int, int, tuple[object, ...]]:
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return family, kind, proto, address


def check_free(host: str, port: int) -> None:
    """Raise OSError when ``host:port`` cannot be bound by a socket of its own (something
    listens there: even a group of SO_REUSEPORT sockets refuses a plain bind)."""
    family, kind, proto, address = _address(host, port)
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is free
        probe.bind(address)


def bind_listener(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening; with ``reuse_port`` it joins the
    SO_REUSEPORT group of the other api processes on that port.

    ``host`` is an IPv4 or IPv6 address or a name (the first address it resolves to);
    raises OSError when the address cannot be bound (the port is taken)."""
    family, kind, proto, address = _address(host, port)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6 and host in ("", "::"):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock
