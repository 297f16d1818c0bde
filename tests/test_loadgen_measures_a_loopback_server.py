"""The loopback load generator (bertforge.runtime.loadgen) against a stdlib HTTP server whose answers we
choose: it sends every request once, keeps order-free counts right, reads Content-Length and chunked bodies
over keep-alive connections, sends raw bytes as given, bounds a run by count and by time, refuses any
host that is not loopback; its percentiles equal numpy's; the served-models table computes its ratios."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from bertforge.errors import BertforgeError
from bertforge.runtime import loadgen as lg


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    seen: list = []
    connections: set = set()

    def log_message(self, *a):
        pass

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["content-length"]))
        _Handler.seen.append(body)
        _Handler.connections.add(self.client_address)
        try:
            texts = json.loads(body.decode("utf-8"))["inputs"]
        except (UnicodeDecodeError, ValueError, KeyError):
            return self._send(422, b'{"error": "bad input", "error_type": "Validation"}')
        if self.path == "/slow":
            time.sleep(0.05)
        out = json.dumps([[float(len(t))] for t in texts]).encode()
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(0, len(out), 5):
                part = out[i:i + 5]
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        self._send(200, out)

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self._send(200, b'{"status": "ok"}')


@pytest.fixture()
def server():
    _Handler.seen, _Handler.connections = [], set()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_every_request_is_sent_once_and_answered(server):
    def make(i):
        if i % 5 == 4:  # raw bytes, sent as they are: invalid UTF-8
            return lg.Request("/embed", b'{"inputs": ["caf\xff"]}', texts=1, kind="bad")
        return lg.json_request("/embed", {"inputs": [f"text {i}"] * (1 + i % 3)}, texts=1 + i % 3)

    samples, wall = lg.run_load("127.0.0.1", server, make, requests=40, concurrency=4,
                                keep_body=lambda s: s.status == 200)
    assert len(samples) == 40 and len(_Handler.seen) == 40
    assert sorted(_Handler.seen) == sorted(make(i).body for i in range(40))
    assert len(_Handler.connections) == 4  # one keep-alive connection per client
    res = lg.summarize(samples, wall)
    assert res["status"] == {"200": 32, "422": 8}
    assert res["ok"] == 32
    assert res["texts"] == sum(1 + i % 3 for i in range(40) if i % 5 != 4)
    assert res["texts_per_s"] == pytest.approx(res["texts"] / wall)
    for s in samples:  # each answer is the one to its own request: as many vectors as it sent texts
        if s.status == 200:
            assert len(json.loads(s.body)) == s.texts


def test_chunked_answers_are_read_whole(server):
    samples, _ = lg.run_load("127.0.0.1", server, lambda i: lg.json_request("/chunked", {"inputs": ["ab", "abc"]}),
                             requests=6, concurrency=2, keep_body=lambda s: True)
    assert [json.loads(s.body) for s in samples] == [[[2.0], [3.0]]] * 6


def test_a_run_stops_at_its_time_bound(server):
    t0 = time.perf_counter()
    samples, wall = lg.run_load("127.0.0.1", server, lambda i: lg.json_request("/slow", {"inputs": ["x"]}),
                                requests=10_000, concurrency=2, max_seconds=0.5)
    assert time.perf_counter() - t0 < 3.0
    assert 4 <= len(samples) < 100  # 50 ms each, two clients, ~0.5 s
    lat = lg.summarize(samples, wall)["p50_ms"]
    assert 50 <= lat < 1000


def test_only_loopback_hosts_are_targets():
    for host in ("10.0.0.1", "192.168.1.1", "8.8.8.8", "example.com"):
        with pytest.raises(BertforgeError, match="loopback"):
            lg.run_load(host, 80, lambda i: lg.Request("/"), requests=1)
    assert lg.check_loopback("127.0.0.2") == "127.0.0.2" and lg.check_loopback("::1") == "::1"


def test_percentiles_equal_numpys():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1001):
        v = rng.exponential(size=n).tolist()
        for q in (0, 50, 95, 99, 100):
            assert lg.percentile(v, q) == pytest.approx(float(np.percentile(v, q)), rel=1e-12)
    assert lg.percentile([], 50) is None


def test_server_process_waits_for_health_and_reports_a_dead_server(tmp_path):
    import sys
    port = lg.free_port()
    script = tmp_path / "srv.py"
    script.write_text(
        "import sys, time\nfrom http.server import HTTPServer, BaseHTTPRequestHandler\n"
        "class H(BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.send_header('content-length', '0'); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "time.sleep(0.5)\n"
        f"HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    with lg.ServerProcess([sys.executable, str(script)], "127.0.0.1", port, startup_timeout=30) as srv:
        assert srv.startup_seconds >= 0.5
        assert lg.http_get("127.0.0.1", port, "/health")[0] == 200
        assert srv.rss() > 1_000_000
    assert srv.returncode is not None and lg.http_get("127.0.0.1", port, "/health")[0] == 0
    dead = tmp_path / "dead.py"
    dead.write_text("import sys\nprint('bertforge: error: model x does not exist', file=sys.stderr)\nsys.exit(2)\n")
    with pytest.raises(BertforgeError, match="exited with status 2 .*model x does not exist"):
        with lg.ServerProcess([sys.executable, str(dead)], "127.0.0.1", lg.free_port(), startup_timeout=30):
            pass


def test_served_table_ratios_are_against_the_teacher():
    from bertforge.pipelines.demo_report import served_table
    served = {"models": [
        {"name": "teacher", "requests": 10, "ok": 10, "concurrency": 4, "texts_per_request": 1, "texts_per_s": 50.0,
         "p50_ms": 80.0, "p95_ms": 90.0, "p99_ms": 99.0},
        {"name": "student-a-int8", "requests": 10, "ok": 9, "concurrency": 4, "texts_per_request": 1,
         "texts_per_s": 175.0, "p50_ms": 20.0, "p95_ms": 25.0, "p99_ms": None}]}
    md, txt = served_table(served)
    rows = [r.split(" | ") for r in md.splitlines()[2:]]
    assert rows[0][-1].rstrip(" |") == "1.00" and rows[1][-1].rstrip(" |") == "3.50"  # 175 / 50
    assert rows[1][8] == "1" and rows[1][7] == "—"  # one non-200 answer; no p99
    assert "student-a-int8" in txt and "texts/s vs teacher (×)" in txt
