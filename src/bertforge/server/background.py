"""``bertforge.serve(...)``: the HTTP server of ``bertforge serve``, started from Python in a background thread of
the calling process (a notebook, a test, a script that serves and calls itself).

    >>> import bertforge, json, urllib.request
    >>> with bertforge.serve("runs/sst2-int8") as srv:            # a free port on 127.0.0.1
    ...     req = urllib.request.Request(srv.url + "/predict", json.dumps({"inputs": "a fine film"}).encode(),
    ...                                  {"Content-Type": "application/json"})
    ...     print(json.load(urllib.request.urlopen(req)))
    [{'label': '1', 'score': 0.97…}, {'label': '0', 'score': 0.02…}]

The app, its routes, limits and answers are those of the command (:func:`bertforge.server.app.build_app`); only
the process differs: no signal handlers (``stop()`` drains instead of SIGTERM), asyncio's own event loop in the
thread (the caller's loop and loop policy are left alone), and the process's malloc settings untouched.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Optional

from ..errors import ConfigError


class ServerHandle:
    """A server running in a background thread: ``url`` (``http://host:port``), ``port``, ``models`` (the
    names requests use); :meth:`stop` (also on leaving a ``with`` block) finishes the requests in flight and the
    queued batches, stops the thread and frees the port."""

    def __init__(self, server, thread: threading.Thread, sock, host: str, models: list):
        self._server, self._thread, self._sock = server, thread, sock
        self.host = host
        self.port = sock.getsockname()[1]
        self.models = models
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server thread is still serving."""
        return self._thread.is_alive()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop accepting connections, let the requests in flight finish (at most the ``grace`` the server was
        started with), finish the queued batches and free the port; wait at most ``timeout`` seconds for the
        thread (None: until it ends). Calling it again does nothing."""
        self._server.should_exit = True
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<bertforge server {self.url} ({', '.join(self.models)}) {state}>"


def _model_map(models) -> dict:
    """``models`` as ``{name: dir or ServedModel}``: a dict as it is; one dir (``str`` / ``Path``) or a list of
    ``DIR`` / ``NAME=DIR`` strings named as ``bertforge serve --model`` names them. Raises ConfigError."""
    if isinstance(models, dict):
        return dict(models)
    if isinstance(models, (str, Path)):
        models = [models]
    if not isinstance(models, (list, tuple)):
        raise ConfigError(f"models is a {type(models).__name__}; pass a dir, a list of dirs (NAME=DIR) or a "
                          f"dict {{name: dir}}")
    from .models import parse_model_args
    return dict(parse_model_args([str(m) for m in models]))


def serve_in_background(models, host: str = "127.0.0.1", port: int = 0, *, grace: float = 30.0,
                        backend: str = "auto", threads: Optional[int] = None, log_level: str = "warning",
                        start_timeout: float = 60.0, **limits) -> ServerHandle:
    """Serve ``models`` over HTTP from a background thread of this process; returns once the server listens.

    Args:
        models: a model dir (checkpoint, ``export`` / ``quantize`` output, ``.onnx`` file, or ``minilm``), a
            list of them (``NAME=DIR`` names one), or ``{name: dir}``; requests name a model with ``"model"``.
        host, port: where to listen (default 127.0.0.1 and a free port: read it from the handle's ``url``).
        grace: seconds the requests in flight get to finish at :meth:`ServerHandle.stop`.
        backend, threads: how the models run (as ``bertforge serve --backend / --threads``).
        log_level: uvicorn's (``warning``: errors only).
        start_timeout: seconds to wait for the server to listen.
        **limits: the server's limits (``max_batch_tokens``, ``max_batch_requests``, ``max_wait_ms``,
            ``max_concurrent_requests``, ``max_client_batch_size``, ``payload_limit``, ``auto_truncate``,
            ``api_key``): :func:`bertforge.server.app.build_app`.
    Returns:
        :class:`ServerHandle` (``.url``, ``.stop()``; a context manager that stops it).
    Raises:
        ConfigError: a port in use, a bad limit or option, a server that did not start in time;
        CheckpointError: a model that cannot be served — each before anything listens.
    """
    import uvicorn

    from .app import build_app
    from .server import bind_socket, fast_io, server_class
    if not grace >= 0:
        raise ConfigError(f"grace={grace}: pass a number of seconds ≥ 0")
    models = _model_map(models)
    sock = bind_socket(host, port)
    try:
        app = build_app(models, backend=backend, threads=threads, **limits)
    except BaseException:
        sock.close()
        raise
    io = {k: v for k, v in fast_io().items() if k == "http"}  # the loop: asyncio's own (no loop policy set)
    config = uvicorn.Config(app, log_level=log_level, log_config=None, access_log=False, lifespan="on",
                            interface="asgi3", timeout_graceful_shutdown=grace, timeout_keep_alive=30,
                            loop="asyncio", **io)
    server = server_class()(config)
    failed: list = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # uvicorn exits (SystemExit) when the app's start-up fails
            failed.append(e)

    thread = threading.Thread(target=run, name=f"bertforge-serve-{sock.getsockname()[1]}", daemon=True)
    handle = ServerHandle(server, thread, sock, host, list(models))
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - t0 > start_timeout:
            handle.stop(timeout=5)
            why = f"{type(failed[0]).__name__}: {failed[0]}" if failed else f"not listening after {start_timeout} s"
            raise ConfigError(f"the server on {handle.url} did not start ({why})")
        time.sleep(0.01)
    return handle


def serve(models, host: str = "127.0.0.1", port: int = 0, **options) -> ServerHandle:
    """``bertforge.serve``: :func:`serve_in_background` (the same arguments, the same :class:`ServerHandle`)."""
    return serve_in_background(models, host, port, **options)


serve.__doc__ = serve_in_background.__doc__

__all__ = ["ServerHandle", "serve", "serve_in_background"]
