"""A bundle in a real browser: the page of ``web/`` served on 127.0.0.1 and driven by headless Chromium.

:func:`run_in_chromium` serves ``web/`` (with its ``node_modules`` from ``npm ci``), the bundle under
``/bundle/`` and a list of texts under ``/fuzz.json``, opens ``index.html?selftest=…`` in ``chromium
--headless`` and returns what the page POSTs back: per model, the token ids and every output for each golden
input and each text (``web/selftest.js``). :func:`compare` checks that report against ``bertforge_lite``'s
answers. :func:`fuzz_texts` makes the texts: CJK, emoji (ZWJ sequences, skin tones, flags), accents and
combining marks, zero-width characters, right-to-left scripts, odd whitespace and texts far longer than any
max length. :func:`search_page` runs the page's semantic search in real time (through Chromium's DevTools
protocol) and returns what it shows; :func:`screenshot` takes the picture of the page in docs/bundle.md with it.

``web/`` is read from the source tree (``<repo>/web``): this module serves a checkout, not an installed wheel.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

from ..errors import BertforgeError

WEB = Path(__file__).resolve().parents[3] / "web"


def chromium() -> Optional[str]:
    """The Chromium executable (Debian's ``chromium``), None when it is not installed."""
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def web_ready() -> Optional[str]:
    """None when ``web/`` can be served, else why not (no checkout, or ``npm ci`` not run in it)."""
    if not (WEB / "index.html").is_file():
        return f"no web/ page at {WEB} (a source checkout has it)"
    if not (WEB / "node_modules" / "onnxruntime-web").is_dir():
        return f"run `npm ci` in {WEB} first (onnxruntime-web is not installed)"
    return None


_BLOCKS = {"cjk": (0x4E00, 0x9FFF), "hiragana": (0x3041, 0x3096), "hangul": (0xAC00, 0xD7A3),
           "emoji": (0x1F600, 0x1F64F), "symbols": (0x1F300, 0x1F5FF), "arabic": (0x0627, 0x064A),
           "hebrew": (0x05D0, 0x05EA), "cyrillic": (0x0410, 0x044F), "greek": (0x0391, 0x03C9),
           "latin1": (0x00C0, 0x00FF), "thai": (0x0E01, 0x0E30)}
_COMBINING = [chr(c) for c in range(0x0300, 0x0370)]
_ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]
_SPACES = [" ", "\u00a0", "\u3000", "\t", "\n", "\u2009"]
_WORDS = ("the movie was good bad funny slow Paris London Ada café naïve résumé über straße coöperate "
          "Zürich São Tomé 東京 北京 大学 ソニー 서울 Москва Αθήνα مرحبا שלום don't U.S.A. e-mail 3.14 #tag @user "
          "COVID-19 ¿qué? ¡sí!").split()
_EMOJI_SEQ = ["😀", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🇫🇷", "🏳️‍🌈", "❤️", "✌🏿", "🤷‍♀️", "1️⃣"]


def fuzz_texts(n: int = 1000, seed: int = 0, long_tokens: int = 600) -> list:
    """``n`` texts (deterministic for ``seed``) mixing :data:`_WORDS`, random characters of CJK, Hangul,
    Arabic, Hebrew … blocks, emoji sequences, combining marks, zero-width characters and odd spaces; every
    tenth text is ~``long_tokens`` words long (far past a bundle's max length)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = long_tokens if i % 10 == 9 else rng.randint(1, 24)
        parts = []
        for _ in range(k):
            r = rng.random()
            if r < 0.45:
                w = rng.choice(_WORDS)
            elif r < 0.65:
                a, b = _BLOCKS[rng.choice(sorted(_BLOCKS))]
                w = "".join(chr(rng.randint(a, b)) for _ in range(rng.randint(1, 4)))
            elif r < 0.75:
                w = rng.choice(_EMOJI_SEQ)
            elif r < 0.85:
                w = rng.choice(_WORDS) + "".join(rng.choice(_COMBINING) for _ in range(rng.randint(1, 3)))
            else:
                w = rng.choice(_WORDS)
                j = rng.randint(0, len(w))
                w = w[:j] + rng.choice(_ZERO_WIDTH) + w[j:]
            parts.append(w)
        out.append("".join(p + rng.choice(_SPACES if rng.random() < 0.2 else [" "]) for p in parts).strip()
                   or "x")
    return out


class _Handler(SimpleHTTPRequestHandler):
    """Static files of web/, the bundle under /bundle/, the texts at /fuzz.json; POST /result stores it."""

    def __init__(self, *args, bundle: Path, fuzz: bytes, sink: dict, **kw):
        self.bundle, self.fuzz, self.sink = bundle, fuzz, sink
        super().__init__(*args, directory=str(WEB), **kw)

    def log_message(self, *args):
        pass

    def translate_path(self, path):
        p = path.split("?", 1)[0].split("#", 1)[0]
        if p.startswith("/bundle/"):
            return str(self.bundle / p[len("/bundle/"):])
        return super().translate_path(path)

    def do_GET(self):
        if self.path.split("?")[0] == "/fuzz.json":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(self.fuzz)))
            self.end_headers()
            self.wfile.write(self.fuzz)
            return
        super().do_GET()

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.sink["report"] = json.loads(self.rfile.read(n) or b"{}")
        self.send_response(204)
        self.end_headers()
        self.sink["done"].set()


SimpleHTTPRequestHandler.extensions_map.update({".mjs": "text/javascript", ".wasm": "application/wasm",
                                               ".onnx": "application/octet-stream"})


def _serve(bundle: Path, texts: list):
    sink = {"done": threading.Event()}
    handler = partial(_Handler, bundle=Path(bundle), fuzz=json.dumps(texts).encode(), sink=sink)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, sink


def _chrome_args(exe: str, profile: str) -> list:
    return [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}"]


def run_in_chromium(bundle, texts: list, timeout: float = 600) -> dict:
    """Serve ``bundle`` and ``texts``, run ``web/selftest.js`` in headless Chromium and return its report
    ({"models": {name: {"golden", "fuzz", "ms_per_text", "load_ms"}}, "error"}).

    Raises:
        BertforgeError: no Chromium, ``web/`` not ready, or no report within ``timeout`` seconds.
    """
    exe = chromium()
    if exe is None:
        raise BertforgeError("chromium is not installed (Debian: apt-get install chromium)")
    why = web_ready()
    if why:
        raise BertforgeError(why)
    server, sink = _serve(bundle, texts)
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html?selftest=/fuzz.json&bundle=/bundle/"
    with tempfile.TemporaryDirectory(prefix="bertforge-chromium-") as profile:
        proc = subprocess.Popen(_chrome_args(exe, profile) + [url], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            if not sink["done"].wait(timeout):
                raise BertforgeError(f"chromium gave no report within {timeout:.0f} s")
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            server.shutdown()
            server.server_close()
    return sink["report"]


class _DevTools:
    """Chromium driven through its DevTools protocol on ``--remote-debugging-pipe``: the browser reads commands
    on its fd 3 and writes replies and events on its fd 4, JSON messages each ended by a NUL byte."""

    def __init__(self, exe: str, profile: str):
        import fcntl
        cmd_r, self._w = os.pipe()   # we write commands, Chromium reads them as fd 3
        self._r, out_w = os.pipe()   # Chromium writes replies as fd 4, we read them
        # the child's ends copied to fds ≥ 10 (so neither is 3 or 4), which a small Python trampoline moves to 3 and
        # 4 before it execs Chromium: no preexec_fn (unsafe beside the server's thread), no shell (dash stops at fd 9)
        a, b = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, out_w))
        argv = _chrome_args(exe, profile) + ["--remote-debugging-pipe", "about:blank"]
        hop = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
               "os.close(int(sys.argv[1])); os.close(int(sys.argv[2])); os.execv(sys.argv[3], sys.argv[3:])")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", hop, str(a), str(b), *argv],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(a, b))
        finally:
            for fd in (cmd_r, out_w, a, b):
                os.close(fd)
        self._buf, self._id = b"", 0

    def call(self, method: str, params: Optional[dict] = None, session: Optional[str] = None,
             timeout: float = 60) -> dict:
        """Send one command and return its ``result`` (events in between are skipped)."""
        import select
        import time
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise BertforgeError(f"chromium: {method}: {reply['error'].get('message')}")
                    return reply.get("result", {})
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise BertforgeError(f"chromium gave no answer to {method} within {timeout:.0f} s")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise BertforgeError(f"chromium exited during {method}")
            self._buf += chunk

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (BertforgeError, OSError):
            pass
        for fd in (self._w, self._r):
            os.close(fd)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: what the page shows once its search ran (``?demo=1``): the hits table's text, or the status line's error
_SEARCH_DONE = """new Promise((done) => { const t = setInterval(() => {
  const hits = document.getElementById("hits"), status = document.getElementById("status");
  if (status && status.className === "err") { clearInterval(t); done("error: " + status.textContent); }
  else if (hits && hits.textContent.includes("query embedded")) { clearInterval(t); done(hits.innerText); }
}, 50); })"""


def search_page(bundle, png=None, size: str = "1000,1100", timeout: float = 180) -> str:
    """Open the page with ``bundle`` (an embedding model first) and its search run (``?demo=1``) in headless
    Chromium, in real time (no virtual time: the times the page shows are wall clock), and return the text of
    the hits table, its last line the time the query took; with ``png``, a screenshot of the page is written
    there too (the picture in docs/bundle.md).

    Raises:
        BertforgeError: no Chromium, ``web/`` not ready, no result within ``timeout`` seconds or the page's
            error.
    """
    exe = chromium()
    if exe is None or web_ready():
        raise BertforgeError("chromium and web/node_modules are needed to run the page")
    server, _ = _serve(bundle, [])
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html?bundle=/bundle/&demo=1"
    width, height = (int(x) for x in size.split(","))
    with tempfile.TemporaryDirectory(prefix="bertforge-chromium-") as profile:
        devtools = _DevTools(exe, profile)
        try:
            target = devtools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = devtools.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            devtools.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                                 "deviceScaleFactor": 1, "mobile": False}, session)
            devtools.call("Page.navigate", {"url": url}, session)
            got = devtools.call("Runtime.evaluate", {"expression": _SEARCH_DONE, "awaitPromise": True,
                                                     "returnByValue": True}, session, timeout=timeout)
            text = got.get("result", {}).get("value")
            if not isinstance(text, str):
                raise BertforgeError(f"the page gave no search result: {got}")
            if text.startswith("error: "):
                raise BertforgeError(f"the page failed: {text[7:]}")
            if png is not None:
                import base64
                shot = devtools.call("Page.captureScreenshot", {"format": "png"}, session)
                Path(png).write_bytes(base64.b64decode(shot["data"]))
        finally:
            devtools.close()
            server.shutdown()
            server.server_close()
    return text


def screenshot(bundle, png, size: str = "1000,1100", timeout: float = 180) -> Path:
    """A PNG of the page with ``bundle`` open and a search run, in real time (:func:`search_page`)."""
    png = Path(png).resolve()
    search_page(bundle, png, size, timeout)
    return png


def compare(report: dict, bundle, texts: list, lite_bundle) -> dict:
    """Check a :func:`run_in_chromium` report against ``lite_bundle(path, name)`` (``bertforge_lite.Bundle``):
    identical token ids, integer / boolean outputs equal, float outputs within the manifest precision's
    tolerance (:func:`bertforge.compress.bundle_manifest.tolerance`: an INT8 model's at least its
    ``int8_rounding``). Returns per model {"texts", "max_abs_diff", "ms_per_text", "load_ms"}; raises
    BertforgeError on the first difference beyond that."""
    import numpy as np
    from ..compress.bundle_manifest import read_manifest, tolerance
    if report.get("error"):
        raise BertforgeError(f"the page failed: {report['error'].splitlines()[0]}")
    manifest = read_manifest(bundle)
    out = {}
    for name, entry in manifest["models"].items():
        got = report["models"][name]
        b = lite_bundle(bundle, name)
        worst = 0.0
        qa = entry["kind"] == "question_answering"
        # a QA model reads (question, context) pairs: its golden pairs and the page's fuzz pairs (text i, i + 1)
        fuzz = [(texts[i], texts[(i + 1) % len(texts)]) for i in range(len(got["fuzz"]))] if qa else texts
        golden = [tuple(g["input"]) if qa else g["input"] for g in entry["golden"]]
        rows = list(zip(golden, got["golden"])) + list(zip(fuzz, got["fuzz"]))
        for text, row in rows:
            if "error" in row:
                raise BertforgeError(f"{name}: the page failed on {text!r:.60}: {row['error']}")
            ids = b.encode([text])[0].ids
            if list(ids) != row["input_ids"]:
                raise BertforgeError(f"{name}: token ids differ for {text!r:.60}: python {list(ids)[:12]}…, "
                                     f"browser {row['input_ids'][:12]}…")
            ref = b.run([text])
            for k in entry["outputs"]:
                a, c = np.asarray(ref[k][0]), np.asarray(row["outputs"][k])
                if a.dtype == bool or np.issubdtype(a.dtype, np.integer):
                    if not np.array_equal(a.astype(np.int64), c.astype(np.int64)):
                        raise BertforgeError(f"{name}: output {k} differs for {text!r:.60}")
                    continue
                d = float(np.abs(a - c).max()) if a.size else 0.0
                worst = max(worst, d)
                bound = tolerance(entry["precision"], a, entry.get("int8_rounding"))
                if d > bound:
                    raise BertforgeError(f"{name}: output {k} differs by {d:.2e} for {text!r:.60} "
                                         f"(> {bound:.1e}, {entry['precision']})")
            if qa:  # the page's answer span: lite's, or (logits equal within the bound) one that scores as well
                _, (best, _, _) = b.answer_span(*text)
                sp = row["span"]
                mine = float("-inf") if sp["start"] < 0 else \
                    float(ref["start_logits"][0][sp["start"]] + ref["end_logits"][0][sp["end"]])
                # each logit within ε of lite's, so a span's score within 2ε: the page's pick scores ≥ best − 4ε
                logits = np.concatenate([ref["start_logits"][0], ref["end_logits"][0]])
                bound = 4 * tolerance(entry["precision"], logits, entry.get("int8_rounding"))
                if not mine >= best - bound:  # (no context token: both −inf)
                    raise BertforgeError(f"{name}: the page's answer span {sp} for {text!r:.60} scores {mine:.4f} "
                                         f"where lite's best scores {best:.4f}")
        out[name] = {"texts": len(rows), "max_abs_diff": worst, "ms_per_text": got["ms_per_text"],
                     "load_ms": got.get("load_ms")}
    return out


__all__ = ["WEB", "chromium", "web_ready", "fuzz_texts", "run_in_chromium", "search_page", "screenshot", "compare"]
