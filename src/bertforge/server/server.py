"""Running the app: bind the port, load the models, serve with uvicorn, drain on SIGTERM / SIGINT.

Order (so that a mistake costs nothing): the port is bound first (a port in use fails at once), then every
model is loaded and warmed (a bad dir fails), and only then does the socket listen. Each failure is a
:class:`~bertforge.errors.BertforgeError`, which the CLI prints as one ``bertforge: error: …`` line (exit 2).
SIGTERM or SIGINT stops accepting connections, lets the requests in flight finish (at most ``grace``
seconds), finishes the queued batches and returns 0.
"""
from __future__ import annotations

import contextlib
import errno
import signal
import socket
import sys
import threading

from ..errors import ConfigError


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound (not yet listening) to ``host:port``. Raises ConfigError when the address is in
    use or cannot be bound."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: pass a port from 1 to 65535 (0 picks a free one)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: cannot resolve it ({e.strerror}); pass an address such as 127.0.0.1") \
            from None
    family, _, proto, _, addr = infos[0]
    # proto IPPROTO_TCP, as getaddrinfo gives it: asyncio sets TCP_NODELAY only on such sockets (with proto 0
    # every answer would wait ~40 ms for the client's delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use; pass another --port or stop what listens "
                              f"there") from None
        raise ConfigError(f"cannot bind {host}:{port} ({e.strerror}); pass another --host / --port") from None
    sock.set_inheritable(True)
    return sock


def server_class():
    """uvicorn's ``Server`` with the graceful-drain signal handling below (main thread only)."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server whose SIGTERM / SIGINT only start the graceful shutdown (uvicorn re-raises the
        signal after shutting down, which would turn a clean drain into exit 143 / 130)."""

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)

        def install_signal_handlers(self):  # older uvicorn
            if threading.current_thread() is threading.main_thread():
                for s in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(s, self.handle_exit)

    return Server


def fast_io() -> dict:
    """uvicorn's fastest event loop and HTTP parser where installed: ``loop="uvloop"`` (libuv) and
    ``http="httptools"`` (llhttp, C); else its pure-Python defaults (asyncio, h11)."""
    import importlib.util
    out = {}
    if importlib.util.find_spec("uvloop") is not None and sys.platform != "win32":
        out["loop"] = "uvloop"
    if importlib.util.find_spec("httptools") is not None:
        out["http"] = "httptools"
    return out


def serve(models: dict, host: str = "127.0.0.1", port: int = 8080, grace: float = 30.0,
          log_level: str = "warning", **limits) -> int:
    """Serve ``models`` (``{name: dir}``) on ``host:port`` until SIGTERM / SIGINT; returns 0 after the drain.
    ``limits``: see :func:`bertforge.server.app.build_app`. Raises ConfigError / CheckpointError before
    anything listens."""
    import uvicorn

    from .app import build_app
    if not grace >= 0:
        raise ConfigError(f"--grace {grace}: pass a number of seconds ≥ 0")
    from ..engine.kernels.allocator import tame_malloc
    tame_malloc()  # before the models load: large buffers are mapped and returned (a flat RSS)
    sock = bind_socket(host, port)
    try:
        app = build_app(models, **limits)
    except BaseException:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on", interface="asgi3",
                            timeout_graceful_shutdown=grace, timeout_keep_alive=30, **fast_io())
    server = server_class()(config)
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"bertforge serve: http://{shown}:{bound} ({', '.join(models)}); Ctrl-C or SIGTERM "
                     f"drains and stops\n")
    sys.stderr.flush()
    server.run(sockets=[sock])
    sock.close()
    return 0


__all__ = ["serve", "bind_socket", "fast_io", "server_class"]
