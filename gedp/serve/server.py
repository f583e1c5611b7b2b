"""``gedp serve``: the releases loaded, the application built and its socket bound (each refused in
one line before anything is served), then served by uvicorn."""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gedp.errors import InputError

#: Addresses that only this machine reaches.
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Connections waiting to be accepted (uvicorn's default).
BACKLOG = 2048


@dataclass(frozen=True)
class Server:
    """Releases ready to serve: their ids, the application and the bound socket."""

    served: list[str]
    application: Any
    listening: socket.socket
    stopping: Callable[[], None] = lambda: None  # told when a stop (Ctrl-C, SIGTERM) is received

    @property
    def port(self) -> int:
        return int(self.listening.getsockname()[1])

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C)."""
        import uvicorn

        stopping = self.stopping

        class Stopped(uvicorn.Server):
            """uvicorn's server, ``stopping`` told at its stop: uvicorn then waits for the requests in flight."""

            def handle_exit(self, sig: int, frame: Any) -> None:
                stopping()
                super().handle_exit(sig, frame)

        config = uvicorn.Config(self.application, log_level="warning", access_log=False)
        Stopped(config).run(sockets=[self.listening])


def open_server(releases: list[Path], *, host: str = "127.0.0.1", port: int = 8000, max_rows: int = 100_000,
                timeout: float = 30.0, cache: bool = True,
                status: Callable[[str], AbstractContextManager] = lambda text: nullcontext()) -> Server:
    """Load ``releases`` (``status`` shows a line meanwhile) and bind ``host``:``port`` (0: a free
    port); a table answered has at most ``max_rows`` rows and computes for at most ``timeout`` s;
    ``cache``: answers kept for requests asked again (``app.create_app``)."""
    from gedp.serve.app import Limits, create_app
    from gedp.serve.releases import load_releases

    if max_rows < 1 or not timeout > 0:
        raise InputError("--max-rows must be >= 1 and --timeout > 0")
    with status("loading releases"):
        served = load_releases(releases)
    application = create_app(served, Limits(max_rows=max_rows, timeout=timeout), cache)
    def stopping() -> None:
        for release in served.values():
            release.stop()

    return Server(list(served), application, listening_socket(host, port), stopping)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host`` and ``port`` (0: a free port) and listening, refused in one line when it
    cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Made for TCP by name: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on such sockets; without
    # it each answer's body waits for the client's delayed acknowledgement of its header (40 ms or more).
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
        # Listening from here, before "Serving" is printed: a client that reads that line and connects at
        # once waits in the backlog until the server accepts, instead of being refused while uvicorn starts.
        listening.listen(BACKLOG)
    except (OSError, OverflowError) as err:
        listening.close()
        raise InputError(f"cannot listen on {host} port {port} ({getattr(err, 'strerror', None) or err})") from None
    return listening
