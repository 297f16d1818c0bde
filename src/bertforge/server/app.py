"""The HTTP API of ``bertforge serve``: an ASGI app (Starlette) over the models' batch workers — the state the
routes share, the request plumbing (body, auth, limits, metrics) and :func:`build_app`. The routes are in
:mod:`~bertforge.server.routes`, the checks of their bodies in :mod:`~bertforge.server.schemas`.

Routes (JSON in and out; docs/serve.md has a curl example of each and the field-by-field table):

* text-embeddings-inference compatible: ``POST /embed``, ``/embed_all``, ``/embed_sparse`` (422: no SPLADE),
  ``/similarity``, ``/predict``, ``/rerank``, ``/tokenize``, ``/decode``;
* OpenAI compatible: ``POST /v1/embeddings``, ``GET /v1/models``;
* beyond TEI: ``POST /ner`` (entities with character offsets), ``POST /qa`` (answer span with character
  offsets);
* ``GET /health``, ``GET /info``, ``GET /metrics`` (Prometheus text), ``GET /openapi.json`` (generated from the
  request models of :mod:`~bertforge.server.schemas`), ``GET /docs`` (that document as a page).

Every POST body may name a model (``"model": NAME``); without it — or with one model served, whatever it names —
the first served model that answers the route does. Errors are ``{"error": "...", "error_type": "..."}`` (on
``/v1/*`` OpenAI's ``{"error": {"message", "type", "param", "code"}}``) with the status
text-embeddings-inference documents: 401 ``unauthorized`` (``api_key`` set, bearer token missing or wrong;
compared in constant time), 413 ``payload_too_large`` (more than ``max_client_batch_size`` inputs, a body over
``payload_limit`` bytes), 422 ``validation`` (malformed JSON, invalid UTF-8, an unknown field, wrong types, empty
text, too long without truncation, an unknown model among several or one that does not answer the route; on
``/v1/*`` an unknown model among several is 404 ``model_not_found``), 429 ``overloaded``
(``max_concurrent_requests`` requests already in flight), 500 ``backend`` (the model failed), 404 / 405 for an
unknown path / method.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import BertforgeError
from .batching import ModelWorker
from .metrics import ServerMetrics
from .models import ServedModel, load_model
from .routes import POST_ROUTES
from .schemas import HTTPError, dumps, invalid, parse

#: the defaults of :func:`build_app` (and the ``bertforge serve`` flags)
LIMITS = {"max_batch_tokens": 16384, "max_batch_requests": 32, "max_wait_ms": 0.0,
          "max_concurrent_requests": 512, "max_client_batch_size": 32, "payload_limit": 2_000_000,
          "auto_truncate": False, "api_key": None}

#: routes that need no bearer token (load balancers' probes)
OPEN_PATHS = ("/health", "/openapi.json", "/docs")

#: the routes answered with GET (the POST ones: :data:`~bertforge.server.routes.POST_ROUTES`)
GET_ROUTES = ("/health", "/info", "/metrics", "/v1/models", "/openapi.json", "/docs")


def _json(obj, status: int = 200) -> Response:
    return Response(dumps(obj).encode(), status, media_type="application/json")


def _error(status: int, message: str, kind: str, path: str = "", code=None) -> Response:
    return _json(error_body(path, status, message, kind, None, code), status)


class ServerState:
    """What the routes share: models, their workers, limits, metrics, the in-flight count."""

    def __init__(self, models: dict, limits: dict, executors: Optional[dict] = None):
        self.models = models
        self.limits = limits
        self.metrics = ServerMetrics()
        for name in models:
            self.metrics.register_model(name)
        self.workers = {name: ModelWorker(m, limits["max_batch_tokens"], limits["max_batch_requests"],
                                          limits["max_wait_ms"], self.metrics, self.arriving,
                                          (executors or {}).get(name))
                        for name, m in models.items()}
        self.in_flight = 0
        self.ready = False
        self.started = time.time()

    def arriving(self) -> bool:
        """Whether a request in flight has not queued its items yet (it is being read or tokenized): only
        then can a batch gain by waiting (see :mod:`bertforge.server.batching`)."""
        return self.in_flight > sum(w.inside for w in self.workers.values())

    def model_for(self, name, route: str, openai: bool = False) -> ServedModel:
        """The model a request names or, without a name, the first that answers ``route``. With one model
        served, any name picks it (as text-embeddings-inference, which serves one, does). An unknown name
        among several: 422, or on ``/v1/*`` (``openai``) 404 ``model_not_found`` as OpenAI answers."""
        if name is not None and len(self.models) > 1:
            if name not in self.models:
                msg = (f"model {json.dumps(name)[:60]} is not served here; choose one of "
                       f"{', '.join(self.models)} (GET /v1/models)")
                if openai:
                    raise HTTPError(404, msg, "invalid_request_error", "model", "model_not_found")
                raise invalid(msg, "model", "model_not_found")
            m = self.models[name]
            if route not in m.routes or (route == "embed" and not m.can_embed):
                raise invalid(f"model {name!r} is a {m.kind} model and does not answer /{route}; it answers "
                              f"{', '.join('/' + r for r in m.routes)}", "model")
            return m
        for m in self.models.values():
            if route in m.routes and (route != "embed" or m.can_embed):
                return m
        need = {"ner": "a token-classification", "qa": "a question-answering",
                "predict": "a sequence-classification"}.get(route, "an embedding")
        raise invalid(f"no served model answers /{route}; serve {need} model dir", "model")

    async def run(self, model: ServedModel, seqs: list, kind: str) -> list:
        try:
            return await self.workers[model.name].run_items(seqs, kind)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise HTTPError(500, f"model {model.name!r} failed: {type(e).__name__}: {str(e)[:200]}",
                            "backend") from None


# ---------------------------------------------------------------------------------------------- plumbing
class _ClientGone(Exception):
    """The client closed the connection before its request body arrived."""


async def _receive_body(scope, receive, limit: int) -> bytes:
    """The request body, read straight from the ASGI ``receive`` channel. Raises 413 (over ``limit``
    bytes, by ``content-length`` before reading or by the bytes read), :class:`_ClientGone`."""
    for k, v in scope["headers"]:
        if k == b"content-length":
            if v.isdigit() and int(v) > limit:
                raise HTTPError(413, f"the body has {int(v)} bytes, more than the {limit} allowed "
                                     f"(--payload-limit)", "payload_too_large")
            break
    chunks, n = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = msg.get("body", b"")
        if chunk:
            n += len(chunk)
            if n > limit:
                raise HTTPError(413, f"the body has more than the {limit} bytes allowed (--payload-limit)",
                                "payload_too_large")
            chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_JSON_HEADERS = (b"content-type", b"application/json")


async def _send_json(send, status: int, obj) -> None:
    body = dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [_JSON_HEADERS, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def error_body(path: str, status: int, message: str, kind: str, param=None, code=None) -> dict:
    """An error answer's body: TEI's ``{"error", "error_type"}``, or on ``/v1/*`` OpenAI's ``{"error":
    {"message", "type", "param", "code"}}`` (``type``: ``invalid_request_error``, ``authentication_error``,
    ``rate_limit_error`` or ``server_error``; ``code``: what went wrong, e.g. ``model_not_found``)."""
    if not path.startswith("/v1/"):
        return {"error": message, "error_type": kind}
    kind_openai = {401: "authentication_error", 429: "rate_limit_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind_openai, "param": param, "code": code or kind}}


def _post_endpoint(st: ServerState, path: str, fn, request_model):
    """The ASGI app of one POST route: body → JSON → ``request_model`` (validated: 422 naming the field) →
    ``fn(st, request)`` → JSON answer, or the error answer. Raw ASGI (no Request / Response objects): this is
    the per-request hot path."""
    limit = st.limits["payload_limit"]

    def fail(status, message, kind, param=None, code=None):
        return status, error_body(path, status, message, kind, param, code)

    async def answer(scope, receive) -> tuple:
        try:
            raw = await _receive_body(scope, receive, limit)
            try:
                body = json.loads(raw)
            except UnicodeDecodeError:
                raise invalid("the body is not valid UTF-8; send UTF-8 JSON", None, "invalid_json") from None
            except ValueError as e:
                raise invalid(f"the body is not valid JSON ({str(e)[:80]}); send a JSON object", None,
                              "invalid_json") from None
            except RecursionError:
                raise invalid("the body nests too deep; send a flat JSON object", None, "invalid_json") from None
            if not isinstance(body, dict):
                raise invalid(f"the body is JSON {_json_kind(body)}; send a JSON object", None, "invalid_json")
            return 200, await fn(st, parse(request_model, body))
        except HTTPError as e:
            return fail(e.status, e.message, e.kind, e.param, e.code)
        except UnicodeError:
            return fail(422, "the input is not valid UTF-8; send valid text", "validation")
        except BertforgeError as e:  # a library check on the input (e.g. a QA question too long)
            return fail(422, " ".join(str(e).split()), "validation")

    async def endpoint(scope, receive, send) -> None:
        try:
            status, obj = await answer(scope, receive)
        except _ClientGone:
            return
        except Exception as e:  # a real failure: logged, answered 500
            import logging
            logging.getLogger("bertforge.server").exception("%s failed", scope["path"])
            status, obj = fail(500, f"{type(e).__name__}: {str(e)[:200]}", "backend")
        try:
            await _send_json(send, status, obj)
        except ValueError as e:  # NaN / inf in an answer (allow_nan=False): a backend failure
            await _send_json(send, 500, error_body(path, 500, f"ValueError: {str(e)[:200]}", "backend"))
    return endpoint


class _Gate:
    """The outer ASGI layer: bearer-token check, the in-flight limit, request metrics."""

    def __init__(self, app, st: ServerState):
        self.app, self.st = app, st
        self.post = {p: _post_endpoint(st, p, r[0], r[1]) for p, r in POST_ROUTES.items()}
        key = st.limits.get("api_key")
        self.key = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        st = self.st
        path = scope["path"]
        route = path if path in POST_ROUTES or path in GET_ROUTES else "other"
        t0 = time.perf_counter()
        status = [499]  # a client that left before the answer

        async def send_wrapped(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        counted = False
        try:
            if self.key is not None and path not in OPEN_PATHS:
                given = dict(scope["headers"]).get(b"authorization", b"")
                if not hmac.compare_digest(given, self.key):
                    return await _error(401, "missing or wrong bearer token; send 'Authorization: Bearer <key>'",
                                        "unauthorized", path, "invalid_api_key")(scope, receive, send_wrapped)
            if scope["method"] == "POST" and path in POST_ROUTES:
                if st.in_flight >= st.limits["max_concurrent_requests"]:
                    return await _error(429, f"{st.in_flight} requests are in flight, the most this server "
                                             f"takes (--max-concurrent-requests); retry later",
                                        "overloaded", path)(scope, receive, send_wrapped)
                st.in_flight += 1
                counted = True
                st.metrics.in_flight.set(st.in_flight)
                return await self.post[path](scope, receive, send_wrapped)
            await self.app(scope, receive, send_wrapped)
        finally:
            if counted:
                st.in_flight -= 1
                st.metrics.in_flight.set(st.in_flight)
            st.metrics.observe_request(route, status[0], time.perf_counter() - t0)


def build_app(models: dict, **limits):
    """The ASGI app serving ``models``.

    Args:
        models: ``{name: dir}`` (a checkpoint dir, an ``export`` / ``quantize`` dir, an ``.onnx`` file or
            ``minilm``), or ``{name: ServedModel}`` already loaded. Loaded (and warmed) here, before the app
            exists, so a bad dir fails before anything listens.
        **limits: ``max_batch_tokens`` (16384; padded tokens per forward pass), ``max_batch_requests`` (32;
            sequences per forward pass), ``max_wait_ms`` (0; how long a batch waits to fill),
            ``max_concurrent_requests`` (512; more → 429), ``max_client_batch_size`` (32; inputs per request,
            more → 413), ``payload_limit`` (2 000 000 bytes; bigger body → 413), ``auto_truncate`` (False;
            the default of a request's ``truncate``), ``api_key`` (None; else every route but /health needs
            ``Authorization: Bearer <key>``), and for loading: ``backend`` (``auto``), ``threads`` (None).
    Returns:
        the app (``app.state.server`` is the :class:`ServerState`). Its lifespan starts the batch schedulers
        and, at shutdown, finishes what is queued.
    Raises:
        CheckpointError / ConfigError: a model that cannot be served; a limit below 1.
    """
    from ..errors import ConfigError
    backend = limits.pop("backend", "auto")
    threads = limits.pop("threads", None)
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise ConfigError(f"unknown limit(s) {', '.join(sorted(unknown))}; choose from {', '.join(LIMITS)}")
    lim = {**LIMITS, **{k: v for k, v in limits.items() if v is not None}}
    for k in ("max_batch_tokens", "max_batch_requests", "max_concurrent_requests", "max_client_batch_size",
              "payload_limit"):
        if not isinstance(lim[k], int) or lim[k] < 1:
            raise ConfigError(f"--{k.replace('_', '-')} {lim[k]}: pass a whole number ≥ 1")
    if not (isinstance(lim["max_wait_ms"], (int, float)) and 0 <= lim["max_wait_ms"] < math.inf):
        raise ConfigError(f"--max-wait-ms {lim['max_wait_ms']}: pass a number of milliseconds ≥ 0")
    if not models:
        raise ConfigError("no model given; pass --model DIR (or NAME=DIR, several times)")
    # each model is loaded, warmed and run on one thread of its own: that thread is the only one that ever
    # runs its intra-op (OpenMP) parallel regions, so the process holds one thread team per model, as the
    # bare model in a script does; a second team on the same cores (e.g. the load's on the main thread)
    # makes libgomp's idle threads sleep after ~100 spins, and every parallel region of every forward pass
    # then pays a futex wake-up
    loaded, executors = {}, {}
    try:
        for name, m in models.items():
            if isinstance(m, ServedModel):
                loaded[name] = m
                continue
            ex = executors[name] = ThreadPoolExecutor(1, thread_name_prefix=f"bertforge-{name}")
            loaded[name] = ex.submit(load_model, name, m, backend, threads).result()
    except BaseException:
        for ex in executors.values():
            ex.shutdown(wait=False)
        raise
    st = ServerState(loaded, lim, executors)

    async def health(request: Request) -> Response:
        if not st.ready:
            return _error(503, "the models are not ready (starting or shutting down)", "unhealthy")
        return _json({"status": "ok", "models": list(st.models)})

    async def info(request: Request) -> Response:
        from .. import __version__
        return _json({"version": __version__, "models": [m.describe() for m in st.models.values()],
                      "limits": {k: v for k, v in lim.items() if k != "api_key"},
                      "auth": lim["api_key"] is not None, "uptime_s": round(time.time() - st.started, 3)})

    async def metrics(request: Request) -> Response:
        body, ctype = st.metrics.render()
        return Response(body, 200, headers={"Content-Type": ctype})

    async def openai_models(request: Request) -> Response:
        created = int(st.started)
        return _json({"object": "list", "data": [{"id": n, "object": "model", "created": created,
                                                  "owned_by": "bertforge"} for n in st.models]})

    from .. import __version__
    from .openapi import DOCS_HTML, build_spec
    spec = dumps(build_spec(POST_ROUTES, __version__)).encode()

    async def openapi(request: Request) -> Response:
        return Response(spec, 200, media_type="application/json")

    async def docs(request: Request) -> Response:
        return Response(DOCS_HTML, 200, media_type="text/html")

    @asynccontextmanager
    async def lifespan(app):
        for w in st.workers.values():
            w.start()
        st.ready = True
        try:
            yield
        finally:
            st.ready = False
            for w in st.workers.values():
                await w.stop()

    # POST routes are answered by _Gate's raw ASGI endpoints; Starlette's copies give 405 to other methods
    routes = [Route(p, _post_endpoint(st, p, r[0], r[1]), methods=["POST"]) for p, r in POST_ROUTES.items()]
    routes += [Route(p, fn, methods=["GET"]) for p, fn in (("/health", health), ("/info", info), ("/metrics", metrics),
                                                         ("/v1/models", openai_models), ("/openapi.json", openapi),
                                                         ("/docs", docs))]

    async def not_found(request, exc):
        code = getattr(exc, "status_code", 404)
        msg = "no such route; see GET /info and docs/serve.md" if code == 404 else \
            f"{request.method} is not allowed on {request.url.path}"
        r = _error(code, msg, "not_found" if code == 404 else "method_not_allowed", request.url.path)
        r.headers.update(getattr(exc, "headers", None) or {})  # 405: Allow
        return r

    inner = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app = _Gate(inner, st)
    app.state = inner.state
    inner.state.server = st
    return app


def _json_kind(value) -> str:
    """How JSON names the type of a decoded value (``null``, ``an array`` …), for error messages."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), type(value).__name__)


__all__ = ["build_app", "HTTPError", "ServerState", "LIMITS", "POST_ROUTES", "GET_ROUTES", "OPEN_PATHS"]

