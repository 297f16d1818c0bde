"""The bounded soak of `bertforge serve`: 20,000 requests at concurrency 16, 10% of them bad.

One `bertforge serve` child process on 127.0.0.1 (a free port) serves --model (default: the embedded
MiniLM checkpoint). The load generator (bertforge.runtime.loadgen: asyncio, HTTP/1.1 keep-alive, closed
loop; bounded by --requests and --max-seconds) sends POST /embed requests: 90% good ones (1 to 8 real
sentences: SST-2 dev and SQuAD v1.1 dev questions from ../shared/data), and every 10th a bad one, in turn
of these kinds, each with the status text-embeddings-inference documents for it:

  malformed-json   a body cut short: '{"inputs": ["abc"'                          → 422
  wrong-type       {"inputs": 42}, {"inputs": [true, 2]}, {"inputs": "x", "normalize": "yes"}  → 422
  empty-string     {"inputs": ""}, {"inputs": ["ok", ""]}                          → 422
  huge-text        one 1 MB text with "truncate": false                             → 413 (over the body
                   limit) or 422 (too many tokens without truncation)
  huge-batch       10,000 texts in one request                                     → 413
  invalid-utf8     a JSON body whose string holds the bytes FF FE                   → 422

Checks, printed as MUST lines: no 5xx (and no request without an answer); each bad request got its
documented 4xx; the request counts by status that GET /metrics reports for /embed (after minus before the
soak) equal the client's; the server's RSS (its process tree, /proc VmRSS) after the soak ≤ 1.1× its RSS
after the warm-up (--warmup requests with the same mix), each read after SETTLE_S seconds without requests.

  python benchmarks/soak_serve.py [--requests 20000] [--concurrency 16] [--model DIR]
Results also go to benchmarks/results/soak_serve.txt (--result); a shorter run (--requests N) writes
there only with --result given explicitly.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
HOST = "127.0.0.1"

#: seconds without requests before each RSS reading: an idle server gives its freed heap pages back after
#: half a second (server/batching.py TRIM_IDLE_S), so both readings are of a settled server
SETTLE_S = 1.0

EXPECTED = {"malformed-json": {422}, "wrong-type": {422}, "empty-string": {422}, "huge-text": {413, 422},
            "huge-batch": {413}, "invalid-utf8": {422}}


def bad_requests(lg) -> list:
    """One list of :class:`Request` per bad kind (the soak takes them in turn)."""
    R = lg.Request  # noqa: N806
    huge_text = json.dumps({"inputs": "lorem ipsum dolor sit amet " * (2**20 // 27 + 1), "truncate": False})
    return [
        ("malformed-json", [R("/embed", b'{"inputs": ["abc"', kind="malformed-json", texts=0)]),
        ("wrong-type", [lg.json_request("/embed", {"inputs": 42}, 0, "wrong-type"),
                        lg.json_request("/embed", {"inputs": [True, 2]}, 0, "wrong-type"),
                        lg.json_request("/embed", {"inputs": "x", "normalize": "yes"}, 0, "wrong-type")]),
        ("empty-string", [lg.json_request("/embed", {"inputs": ""}, 0, "empty-string"),
                          lg.json_request("/embed", {"inputs": ["ok", ""]}, 0, "empty-string")]),
        ("huge-text", [R("/embed", huge_text.encode(), kind="huge-text", texts=0)]),
        ("huge-batch", [lg.json_request("/embed", {"inputs": ["a short text"] * 10_000}, 0, "huge-batch")]),
        ("invalid-utf8", [R("/embed", b'{"inputs": "caf\xff\xfe au lait"}', kind="invalid-utf8", texts=0)]),
    ]


def request_counts(metrics_text: str, route: str = "/embed") -> tuple:
    """(metric name, {status: count}) of the request counter for ``route`` in Prometheus text: the
    ``*_total`` family whose samples carry a route/path/handler label and a status/code label."""
    found: dict = {}
    for ln in metrics_text.splitlines():
        if ln.startswith("#") or "{" not in ln:
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)\{(.*)\}\s+([0-9.eE+\-]+|NaN|\+Inf)", ln)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2), float(m.group(3))
        if not name.endswith("_total") or "request" not in name:
            continue
        lab = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
        r = lab.get("route", lab.get("path", lab.get("handler")))
        st = lab.get("status", lab.get("code", lab.get("status_code")))
        if r != route or st is None:
            continue
        found.setdefault(name, {})
        found[name][st] = found[name].get(st, 0) + int(value)
    if not found:
        return None, {}
    name = max(found, key=lambda n: sum(found[n].values()))
    return name, found[name]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--bad-every", type=int, default=10, help="every Nth request is bad (10: 10%%)")
    ap.add_argument("--warmup", type=int, default=600, help="requests before the RSS baseline")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--max-seconds", type=float, default=1800.0, help="wall-clock bound of the soak")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--result", type=Path, help="default benchmarks/results/soak_serve.txt for the full run")
    args = ap.parse_args()
    if args.result is None and args.requests >= 20_000:
        args.result = ROOT / "benchmarks" / "results" / "soak_serve.txt"

    from bench_serve import real_texts
    from bertforge.runtime import loadgen as lg
    from bertforge.runtime.bench import cpu_flags
    from bertforge.checkpoint import resolve_model_dir

    lines: list = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    texts, about = real_texts(args.data)
    bad = bad_requests(lg)

    def make(i: int):
        if args.bad_every and i % args.bad_every == args.bad_every - 1:
            j = i // args.bad_every
            kind, reqs = bad[j % len(bad)]
            return reqs[(j // len(bad)) % len(reqs)]
        k = 1 + (i * 7919) % 8
        s = (i * 31) % len(texts)
        chunk = [texts[(s + n) % len(texts)] for n in range(k)]
        return lg.json_request("/embed", {"inputs": chunk if k > 1 else chunk[0]}, texts=k)

    model = resolve_model_dir(args.model)
    port = lg.free_port(HOST)
    argv = lg.bertforge_serve_argv({"model": model}, HOST, port)
    say("# soak_serve: bounded soak of bertforge serve (loopback)")
    say(f"# command: python benchmarks/soak_serve.py {' '.join(sys.argv[1:])}".rstrip())
    say(f"# date (UTC) {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}; {os.cpu_count()} CPUs; load average "
        f"{os.getloadavg()[0]:.2f}; cpu flags: {' '.join(cpu_flags())}")
    say(f"# server: {' '.join(argv[3:])}")
    say(f"# {args.requests} requests at concurrency {args.concurrency}, every {args.bad_every}th bad "
        f"({', '.join(k for k, _ in bad)} in turn); good: 1–8 texts of {about}")
    with lg.ServerProcess(argv, HOST, port, name="bertforge serve", env={"BERTFORGE_NO_PROGRESS": "1"}) as srv:
        say(f"# healthy after {srv.startup_seconds:.1f} s; RSS at start {srv.rss() / 2**20:.1f} MiB")
        ws, wwall = lg.run_load(HOST, port, make, args.warmup, args.concurrency, max_seconds=600)
        warm = lg.summarize(ws, wwall)
        time.sleep(SETTLE_S)
        rss_warm = srv.rss()
        st, body = lg.http_get(HOST, port, "/metrics")
        metric, before = request_counts(body.decode("utf-8", "replace")) if st == 200 else (None, {})
        say(f"# warm-up: {warm['requests']} requests, status {warm['status']}; RSS after warm-up "
            f"{rss_warm / 2**20:.1f} MiB")
        samples, wall = lg.run_load(HOST, port, lambda i: make(i + args.warmup), args.requests, args.concurrency,
                                    max_seconds=args.max_seconds, keep_body=lambda s: s.status >= 500)
        time.sleep(SETTLE_S)
        rss_end = srv.rss()
        st2, body2 = lg.http_get(HOST, port, "/metrics")
        metric2, after = request_counts(body2.decode("utf-8", "replace")) if st2 == 200 else (None, {})
        code = srv.stop()
    res = lg.summarize(samples, wall)
    say(f"# soak: {res['requests']} requests in {wall:.1f} s ({res['requests'] / wall:.0f} requests/s), "
        f"status {res['status']}; good requests {res['texts_per_s']:.0f} texts/s, p50 {res['p50_ms']:.1f} ms, "
        f"p99 {res['p99_ms']:.1f} ms; server exit status after SIGTERM {code}")
    by_kind: dict = {}
    for s in samples:
        by_kind.setdefault(s.kind, {}).setdefault(s.status, 0)
        by_kind[s.kind][s.status] += 1
    for kind, counts in sorted(by_kind.items()):
        exp = "2xx" if kind == "ok" else "/".join(map(str, sorted(EXPECTED[kind])))
        say(f"#   {kind:<15} {sum(counts.values()):>6} requests, status {dict(sorted(counts.items()))} (documented {exp})")
    five = sum(v for k, v in res["status"].items() if k.startswith("5"))
    none = res["status"].get("0", 0)
    fivexx = [s for s in samples if s.status >= 500][:3]
    say("")
    say(f"MUST no 5xx and no request without an answer: {five} 5xx, {none} unanswered — "
        f"{'met' if five == 0 and none == 0 else 'NOT MET'}" +
        (f" (e.g. {fivexx[0].kind}: {fivexx[0].body[:200]!r})" if fivexx else ""))
    wrong = {k: {s: n for s, n in c.items() if s not in EXPECTED[k]} for k, c in by_kind.items() if k != "ok"}
    wrong = {k: v for k, v in wrong.items() if v}
    okbad = {s: n for s, n in by_kind.get("ok", {}).items() if not 200 <= s < 300}
    say(f"MUST each bad request gets its documented 4xx (and each good one 200): "
        f"{'met' if not wrong and not okbad else 'NOT MET: ' + json.dumps({**wrong, **({'ok': okbad} if okbad else {})})}")
    if metric is None or metric2 is None:
        say(f"MUST /metrics request counts equal the client's: NOT MET — no request counter for /embed with a "
            f"status label in GET /metrics (answered {st2})")
    else:
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
        delta = {k: v for k, v in delta.items() if v}
        client = {k: v for k, v in res["status"].items() if k != "0"}
        same = delta == client
        say(f"MUST /metrics request counts equal the client's ({metric}, route /embed, after − before the soak): "
            f"server {dict(sorted(delta.items()))} vs client {dict(sorted(client.items()))} — "
            f"{'met' if same else 'NOT MET'}")
    ratio = rss_end / rss_warm if rss_warm and rss_end else None
    say(f"MUST RSS after the soak ≤ 1.1× RSS after warm-up: {rss_end / 2**20:.1f} / {rss_warm / 2**20:.1f} MiB = "
        f"{ratio:.3f}× — {'met' if ratio is not None and ratio <= 1.1 else 'NOT MET'}")
    if args.result:
        from bertforge.io import atomic_write_text
        args.result.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.result, "\n".join(lines) + "\n")
        print(f"written: {args.result}")
    return 0 if all("NOT MET" not in ln for ln in lines if ln.startswith("MUST")) else 1


if __name__ == "__main__":
    sys.exit(main())
