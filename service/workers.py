"""Several `scehr serve` workers, each accepting on a listening socket of its own.

Why: when the workers share one listening socket, asyncio's accept loop takes every pending
connection it can per wake-up, so under many keep-alive connections one worker may end up
holding most of them and the server runs on one core. On Linux, each worker binds its own
`SO_REUSEPORT` socket to the same address instead, and the kernel spreads new connections over
the sockets by a hash of their addresses.

uvicorn's own supervisor (`Multiprocess`) is reused unchanged, with its graceful stop, its
replacement of a worker that dies and its stop when a worker fails at startup. The parent hands
it a `Reservation` (a bound, not listening `SO_REUSEPORT` socket that holds the port) in place of
the shared socket; each worker receives it as a fresh socket of its own bound to the same
address (`Reservation.__reduce__`). uvicorn listens on it only once the worker's models are
loaded, so no connection waits on a worker that is still starting.
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import cast

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

logger = logging.getLogger("uvicorn.error")


def reuse_port_balances() -> bool:
    """Whether `SO_REUSEPORT` spreads connections over the sockets (Linux only: elsewhere the
    option exists on some systems but one socket takes every connection)."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "SO_REUSEPORT"):
        return False
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    except OSError:
        return False
    return True


def check_port_free(host: str, port: int) -> None:
    """Raise OSError when another process already listens on host:port (as uvicorn's own bind
    would, with SO_REUSEADDR so that connections in TIME_WAIT do not count)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _reuse_port_socket(family: socket.AddressFamily, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def _worker_socket(family: socket.AddressFamily, address: tuple[str, int]) -> socket.socket:
    """In a worker: its own socket on the reserved address (a failure stops the server)."""
    try:
        return _reuse_port_socket(family, address)
    except OSError as e:
        print(f"scehr serve: a worker cannot bind {address[0]}:{address[1]}: {e.strerror}",
              file=sys.stderr)
        sys.exit(STARTUP_FAILURE)


class Reservation:
    """The port, held by the parent while the workers run; pickled, a worker's own socket."""

    def __init__(self, host: str, port: int) -> None:
        self.socket = _reuse_port_socket(_family(host), (host, port))

    def __reduce__(self) -> tuple[object, tuple[socket.AddressFamily, tuple[str, int]]]:
        return _worker_socket, (self.socket.family, self.socket.getsockname()[:2])

    def close(self) -> None:
        self.socket.close()


def run_workers(config: uvicorn.Config, reservation: Reservation | None) -> int:
    """Run config.workers workers under uvicorn's supervisor until it stops; returns the exit
    status (1 when a worker failed at startup). Without a reservation they share one socket;
    the reservation stays the caller's to close."""
    shared = None
    if reservation is None:
        shared = config.bind_socket()
        logger.info("SO_REUSEPORT does not spread connections here: the workers share one "
                    "listening socket")
    else:
        logger.info("Listening on %s:%d with %d workers, each accepting on its own SO_REUSEPORT "
                    "socket", config.host, config.port, config.workers)
    supervisor = Multiprocess(config, sockets=[shared or cast(socket.socket, reservation)])
    try:
        supervisor.run()
    except KeyboardInterrupt:  # as uvicorn.run: Ctrl+C is a stop, not an error
        pass
    finally:
        if shared is not None:
            shared.close()
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        print("scehr serve: a worker failed to start (see the log above); server stopped",
              file=sys.stderr)
        return 1
    return 0
