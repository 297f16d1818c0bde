"""A bounded loopback HTTP load generator, and a harness that runs a server as a child process.

Used by ``bertforge serve-bench`` (the demo's serving stage), ``benchmarks/bench_serve.py`` and
``benchmarks/soak_serve.py``. Standard library only: asyncio streams speaking HTTP/1.1 with keep-alive, one
connection per simulated client. A client this thin costs the machine little CPU, so on a small machine
the generator takes as little as it can from the server it measures (every server is measured by the same
generator, so the cost is the same for each), and it sends bytes no JSON library would (malformed JSON,
invalid UTF-8) for the error soak.

* :func:`run_load` — ``concurrency`` clients, each sending its next request as soon as the previous one is
  answered (a closed loop), until ``requests`` have been sent or ``max_seconds`` have passed;
  every answer is recorded as a :class:`Sample` (status, latency in seconds, texts it carried).
* :func:`summarize` — texts/s (texts in 2xx answers / wall seconds), latency p50/p95/p99 (ms, of the 2xx
  answers; linear interpolation between order statistics, as ``numpy.percentile``) and counts by status.
* :class:`ServerProcess` — starts a server command, waits until its health route answers 200, reports
  its resident memory (the process and its children, from ``/proc``) and stops it with SIGTERM
  (SIGKILL after a grace period).

Safety: only loopback hosts are accepted (127.0.0.0/8, ``::1``, ``localhost``), and every run is bounded by
a request count and a wall-clock limit.
"""
from __future__ import annotations

import asyncio
import http.client
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..errors import BertforgeError


def check_loopback(host: str) -> str:
    """``host`` if it is a loopback address (or ``localhost``); BertforgeError otherwise."""
    if host == "localhost":
        return host
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise BertforgeError(f"host {host!r} is not a loopback address; the load generator only targets "
                         f"127.0.0.0/8, ::1 or localhost")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------- requests
@dataclass
class Request:
    """One HTTP request to send: ``body`` raw bytes (sent as they are, with ``content-type`` JSON unless
    ``headers`` say otherwise); ``texts``: how many texts it carries (for texts/s); ``kind``: a label the
    samples keep (the soak's request classes)."""
    path: str
    body: bytes = b""
    method: str = "POST"
    headers: dict = field(default_factory=dict)
    texts: int = 1
    kind: str = "ok"


def json_request(path: str, payload, texts: int = 1, kind: str = "ok", headers: Optional[dict] = None) -> Request:
    """A :class:`Request` whose body is ``payload`` as compact JSON (UTF-8)."""
    return Request(path, json.dumps(payload, separators=(",", ":")).encode(), texts=texts, kind=kind,
                   headers=dict(headers or {}))


@dataclass
class Sample:
    """One answered (or failed) request: ``status`` 0 when the connection failed or timed out."""
    kind: str
    status: int
    seconds: float
    texts: int
    body: bytes = b""


class _Conn:
    """One keep-alive HTTP/1.1 connection (reconnects when the server closed it)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: Optional[asyncio.StreamReader] = None
        self.writer: Optional[asyncio.StreamWriter] = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except Exception:  # noqa: BLE001  (already reset by the peer)
                pass
        self.reader = self.writer = None

    async def request(self, req: Request) -> tuple:
        """(status, body bytes) of one request; raises OSError / asyncio.IncompleteReadError on a broken
        connection (the caller reconnects)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = [f"{req.method} {req.path} HTTP/1.1", f"host: {self.host}:{self.port}",
                f"content-length: {len(req.body)}"]
        hdrs = {"content-type": "application/json", **{k.lower(): v for k, v in req.headers.items()}}
        head += [f"{k}: {v}" for k, v in hdrs.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + req.body)
        await self.writer.drain()
        status_line = await self.reader.readuntil(b"\r\n")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
        status = int(parts[1])
        headers = {}
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while (await self.reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                        pass
                    break
                chunks.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            body = b"".join(chunks)
        elif "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        else:  # no length: the body runs to the end of the connection
            body = await self.reader.read()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, body


async def _run(host: str, port: int, make: Callable[[int], Request], requests: int, concurrency: int,
               max_seconds: float, timeout: float, keep_body: Callable[[Sample], bool]) -> tuple:
    samples: list = []
    next_i = 0
    t0 = time.perf_counter()
    deadline = t0 + max_seconds

    async def client():
        nonlocal next_i
        conn = _Conn(host, port)
        try:
            while next_i < requests and time.perf_counter() < deadline:
                i = next_i
                next_i += 1
                req = make(i)
                t = time.perf_counter()
                try:
                    status, body = await asyncio.wait_for(conn.request(req), timeout)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                        asyncio.TimeoutError, ValueError):
                    status, body = 0, b""
                    await conn.close()
                s = Sample(req.kind, status, time.perf_counter() - t, req.texts)
                if keep_body(s):
                    s.body = body
                samples.append(s)
        finally:
            await conn.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples, time.perf_counter() - t0


def run_load(host: str, port: int, make: Callable[[int], Request], requests: int, concurrency: int = 1,
             max_seconds: float = 60.0, timeout: float = 60.0,
             keep_body: Callable[[Sample], bool] = lambda s: False) -> tuple:
    """Send up to ``requests`` requests (``make(i)`` builds the i-th) from ``concurrency`` closed-loop
    clients, stopping early once ``max_seconds`` have passed. Returns ``(samples, wall_seconds)``.

    Raises:
        BertforgeError: ``host`` is not a loopback address, or ``requests`` / ``concurrency`` < 1.
    """
    check_loopback(host)
    if requests < 1 or concurrency < 1 or max_seconds <= 0:
        raise BertforgeError(f"requests={requests}, concurrency={concurrency}, max_seconds={max_seconds}: "
                             f"each must be positive")
    coro = _run(host, port, make, requests, min(concurrency, requests), max_seconds, timeout, keep_body)
    try:  # uvloop where installed: the client's own overhead, the same for every server measured, smaller
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    if factory is None or not hasattr(asyncio, "Runner"):  # (asyncio.Runner: Python ≥ 3.11)
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile (0–100), linear interpolation between order statistics (``numpy``'s
    default); None for no values."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summarize(samples: list, wall_seconds: float) -> dict:
    """``requests``, ``ok`` (2xx), ``texts`` (in 2xx answers), ``texts_per_s`` and ``requests_per_s`` (per
    wall second), ``p50_ms`` / ``p95_ms`` / ``p99_ms`` (2xx latencies), ``status`` (count per status code,
    0 = no answer), ``seconds`` (wall)."""
    ok = [s for s in samples if 200 <= s.status < 300]
    lat = [1000.0 * s.seconds for s in ok]
    status: dict = {}
    for s in samples:
        status[s.status] = status.get(s.status, 0) + 1
    texts = sum(s.texts for s in ok)
    return {"requests": len(samples), "ok": len(ok), "texts": texts,
            "texts_per_s": texts / wall_seconds if wall_seconds > 0 else None,
            "requests_per_s": len(ok) / wall_seconds if wall_seconds > 0 else None,
            "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "p99_ms": percentile(lat, 99),
            "status": {str(k): v for k, v in sorted(status.items())}, "seconds": wall_seconds}


def http_get(host: str, port: int, path: str, timeout: float = 10.0) -> tuple:
    """(status, body bytes) of a GET on a loopback server; (0, b"") when nothing answers."""
    check_loopback(host)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------- the server
def _children(pid: int) -> list:
    """``pid`` and its descendants (from /proc; just ``[pid]`` where /proc is missing)."""
    kids: dict = {}
    try:
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = Path(f"/proc/{d}/stat").read_text()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
    except OSError:
        return [pid]
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def rss_bytes(pid: int) -> Optional[int]:
    """Resident memory (bytes) of process ``pid`` and its descendants (VmRSS from /proc), None if unknown."""
    total, seen = 0, False
    for p in _children(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    seen = True
        except OSError:
            continue
    return total if seen else None


class ServerProcess:
    """A server run as a child process for the length of a ``with`` block.

    ``argv``: the command (its own process group); ``env``: extra environment variables; the server's
    output goes to ``log`` (a temporary file unless given). Entering waits until ``GET health`` answers
    200 (polling every 0.25 s, at most ``startup_timeout`` seconds); leaving sends SIGTERM and, after
    ``grace`` seconds, SIGKILL.

    Raises (on entering):
        BertforgeError: the process exited before it was healthy (its last output line is quoted), or it
        was not healthy in time.
    """

    def __init__(self, argv: list, host: str, port: int, health: str = "/health", env: Optional[dict] = None,
                 startup_timeout: float = 300.0, grace: float = 20.0, log: Optional[Path] = None,
                 name: Optional[str] = None):
        self.argv, self.host, self.port, self.health = [str(a) for a in argv], check_loopback(host), port, health
        self.env = {**os.environ, **(env or {})}
        self.startup_timeout, self.grace = startup_timeout, grace
        self.name = name or Path(self.argv[0]).name
        self._tmp = None
        if log is None:
            self._tmp = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)
            log = Path(self._tmp.name)
        self.log = Path(log)
        self.proc: Optional[subprocess.Popen] = None
        self.startup_seconds: Optional[float] = None
        self.returncode: Optional[int] = None

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> "ServerProcess":
        t0 = time.perf_counter()
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                last = [ln for ln in self.tail(40).splitlines() if ln.strip()]
                raise BertforgeError(f"{self.name} exited with status {self.proc.returncode} before it was "
                                     f"healthy: {last[-1] if last else '(no output)'} (log: {self.log})")
            status, _ = http_get(self.host, self.port, self.health, timeout=5.0)
            if status == 200:
                break
            if time.perf_counter() - t0 > self.startup_timeout:
                self.stop()
                raise BertforgeError(f"{self.name} was not healthy (GET {self.health} → 200) within "
                                     f"{self.startup_timeout:.0f} s (log: {self.log})")
            time.sleep(0.25)
        self.startup_seconds = time.perf_counter() - t0
        return self

    def rss(self) -> Optional[int]:
        return rss_bytes(self.proc.pid) if self.proc is not None else None

    def stop(self) -> Optional[int]:
        """SIGTERM (the process group), wait ``grace`` s, then SIGKILL; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            self.returncode = self.proc.returncode if self.proc is not None else None
            return self.returncode
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(self.grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.returncode = self.proc.returncode
        return self.returncode

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._tmp is not None and exc[0] is None:
            try:
                os.unlink(self.log)
            except OSError:
                pass


def bertforge_serve_argv(models: dict, host: str, port: int, extra: Sequence[str] = ()) -> list:
    """The command line of ``bertforge serve`` (this interpreter) for ``models`` (name → dir)."""
    argv = [sys.executable, "-m", "bertforge", "serve"]
    for name, d in models.items():
        argv += ["--model", f"{name}={d}"]
    return argv + ["--host", host, "--port", str(port), *extra]


def interleaved_bursts(host: str, port: int, makers: dict, requests: int, concurrency: int, rounds: int,
                       max_seconds: float) -> dict:
    """Each of ``makers`` (name → ``make(i) -> Request``) sends ``requests`` requests from ``concurrency``
    closed-loop clients, in ``rounds`` turns taken in alternating order (so that load from other processes
    hits every name alike), each name's bursts bounded by ``max_seconds`` of wall time in all.

    Returns:
        name → ``(samples, wall seconds of its bursts)``, for :func:`summarize`."""
    per = {n: ([], 0.0) for n in makers}
    budget = {n: requests for n in makers}
    t_end = {n: max_seconds for n in makers}
    for r in range(rounds):
        order = list(makers) if r % 2 == 0 else list(reversed(makers))
        for name in order:
            n = budget[name] if r == rounds - 1 else requests // rounds
            if n < 1 or t_end[name] <= 0:
                continue
            samples, wall = run_load(host, port, makers[name], n, concurrency, max_seconds=t_end[name])
            per[name] = (per[name][0] + samples, per[name][1] + wall)
            budget[name] -= len(samples)
            t_end[name] -= wall
    return per


__all__ = ["Request", "Sample", "json_request", "run_load", "summarize", "percentile", "http_get", "free_port",
           "check_loopback", "rss_bytes", "ServerProcess", "bertforge_serve_argv", "interleaved_bursts"]
