"""A tiny outbound-webhook receiver on loopback, for tests and demos of channel delivery.

It records every POST (path, headers, JSON body) and answers what it is told: queue status
codes with ``respond(500, 500)`` (consumed one per request, then ``default_status``), or
make every answer wait ``hang_s`` seconds (to exercise timeouts).

    with WebhookReceiver() as hook:
        config = {"channels": {"relay": {"webhook": {"url": hook.url}}}}
        ...
        (first,) = hook.wait_for(1)
        assert first.headers["idempotency-key"]
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Received", "WebhookReceiver"]


@dataclass(frozen=True)
class Received:
    """One recorded request (header names lower-case; ``at`` = monotonic arrival time)."""

    path: str
    headers: dict[str, str]
    body: Any
    status: int
    at: float


class _Server(ThreadingHTTPServer):
    # A chat platform accepts a burst of deliveries at once: with the standard library's
    # backlog of 5, a worker posting from 32 threads saw connections dropped and retried by
    # the kernel a second later, past a test's delivery timeout.
    request_queue_size = 128
    daemon_threads = True


class WebhookReceiver:
    """Records POSTs on a free loopback port and answers with scripted status codes."""

    def __init__(self, *, default_status: int = 200, host: str = "127.0.0.1") -> None:
        self.default_status = default_status
        self.hang_s = 0.0
        self._statuses: deque[int] = deque()
        self._received: list[Received] = []
        self._lock = threading.Condition()
        self._server = _Server((host, 0), self._handler_class())
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The URL to configure as ``channels.<name>.webhook.url``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def respond(self, *statuses: int) -> None:
        """Answer the next requests with these status codes, in order."""
        with self._lock:
            self._statuses.extend(statuses)

    @property
    def received(self) -> list[Received]:
        """Every request so far, oldest first."""
        with self._lock:
            return list(self._received)

    def idempotency_keys(self) -> list[str]:
        """The ``Idempotency-Key`` header of every request, in order."""
        return [r.headers.get("idempotency-key", "") for r in self.received]

    def wait_for(self, count: int, timeout_s: float = 20.0) -> list[Received]:
        """Block until at least ``count`` requests arrived (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while len(self._received) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self._received)} webhook requests, wanted {count}")
                self._lock.wait(left)
            return list(self._received)

    def start(self) -> WebhookReceiver:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _next_status(self) -> int:
        with self._lock:
            return self._statuses.popleft() if self._statuses else self.default_status

    def _record(self, item: Received) -> None:
        with self._lock:
            self._received.append(item)
            self._lock.notify_all()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                if receiver.hang_s:
                    time.sleep(receiver.hang_s)
                status = receiver._next_status()
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver._record(Received(self.path, headers, body, status, arrived))
                payload = json.dumps({"ok": 200 <= status < 300}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                """Stay quiet in test output."""

        return Handler
