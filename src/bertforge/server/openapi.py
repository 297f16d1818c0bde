"""``GET /openapi.json`` and ``GET /docs``: the OpenAPI 3.1 document of the server, generated from the request and
answer models of :mod:`~bertforge.server.schemas` — the classes every request is validated with — so that the
document cannot drift from what the server takes; and a page that renders it.

The page is one self-contained HTML file (no script or style from a CDN: the server may have no network, and a
pinned Swagger UI bundle would be a dependency for one page): it fetches ``/openapi.json`` and lists each route
with its request fields (type, default, description) and its answers by status.
"""
from __future__ import annotations

from pydantic.json_schema import models_json_schema

from . import schemas as S

#: the answers every POST route may give besides 200, and why (docs/serve.md, "Limits and errors")
ERRORS = {"401": "API key set and the bearer token missing or wrong",
          "413": "more inputs than --max-client-batch-size, or a body over --payload-limit",
          "422": "invalid body: malformed JSON, an unknown field, a wrong type or value (names the field), a "
                 "text too long without truncate, a model that does not answer the route",
          "429": "--max-concurrent-requests requests already in flight",
          "500": "the model failed (never for bad input)"}

_REF = "#/components/schemas/{model}"


def _json(ref: str, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": ref}}}}


def build_spec(post_routes: dict, version: str) -> dict:
    """The OpenAPI 3.1 document of a server whose POST routes are ``post_routes`` (path → (route, request
    model, answer model, summary): :data:`bertforge.server.routes.POST_ROUTES`)."""
    models = [(m, "validation") for _, req, ans, _ in post_routes.values() for m in (req, ans)]
    models += [(m, "validation") for m in (S.ErrorResponse, S.OpenAIError, S.OpenAIModels)]
    refs, defs = models_json_schema(models, ref_template=_REF)
    name = {m: refs[(m, "validation")]["$ref"] for m, _ in models}
    paths = {}
    for path, (fn, req, ans, summary) in post_routes.items():
        err = name[S.OpenAIError if path.startswith("/v1/") else S.ErrorResponse]
        responses = {"200": _json(name[ans], ans.__doc__ or "the answer")}
        responses.update({code: _json(err, why) for code, why in ERRORS.items()})
        if path.startswith("/v1/"):
            responses["404"] = _json(err, "several models served, and `model` names none of them "
                                          "(code model_not_found)")
        paths[path] = {"post": {"summary": summary, "operationId": fn.__name__,
                                "description": (req.__doc__ or "").strip(),
                                "requestBody": {"required": True, "content": {"application/json": {
                                    "schema": {"$ref": name[req]}}}},
                                "responses": responses}}
    text = {"200": {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}}
    unauthorized = {"401": _json(name[S.ErrorResponse], ERRORS["401"])}
    paths["/health"] = {"get": {"summary": "Whether every model is loaded and warmed", "operationId": "health",
                                "responses": {"200": {"description": "ready", "content": {"application/json": {
                                    "schema": {"type": "object"}}}},
                                    "503": _json(name[S.ErrorResponse], "starting or shutting down")}}}
    paths["/info"] = {"get": {"summary": "The served models, their routes and the limits", "operationId": "info",
                              "responses": {"200": {"description": "facts", "content": {"application/json": {
                                  "schema": {"type": "object"}}}}, **unauthorized}}}
    paths["/metrics"] = {"get": {"summary": "Prometheus metrics", "operationId": "metrics",
                                 "responses": {**text, **unauthorized}}}
    paths["/v1/models"] = {"get": {"summary": "The served models (OpenAI)", "operationId": "openai_models",
                                   "responses": {"200": _json(name[S.OpenAIModels], "the models"),
                                                 "401": _json(name[S.OpenAIError], ERRORS["401"])}}}
    paths["/openapi.json"] = {"get": {"summary": "This document", "operationId": "openapi",
                                      "responses": {"200": {"description": "OpenAPI 3.1", "content": {
                                          "application/json": {"schema": {"type": "object"}}}}}}}
    paths["/docs"] = {"get": {"summary": "This document as a page", "operationId": "docs",
                              "responses": {"200": {"description": "HTML", "content": {
                                  "text/html": {"schema": {"type": "string"}}}}}}}
    return {"openapi": "3.1.0",
            "info": {"title": "bertforge serve", "version": version,
                     "description": "text-embeddings-inference and OpenAI compatible inference server "
                                    "(docs/serve.md has the field-by-field table)."},
            "paths": paths, "components": {"schemas": defs.get("$defs", {}),
                                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}


DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>bertforge serve: API</title>
<style>
body{font:15px/1.45 system-ui,sans-serif;max-width:70em;margin:2em auto;padding:0 1em;color:#222}
h2{margin-top:2em;border-bottom:1px solid #ccc} code{background:#f3f3f3;padding:0 .2em}
table{border-collapse:collapse;margin:.5em 0 1em} td,th{border:1px solid #ddd;padding:.25em .5em;
text-align:left;vertical-align:top} .m{font-weight:bold;color:#06c}
</style></head><body><h1>bertforge serve</h1>
<p>Generated from <a href="openapi.json">/openapi.json</a> (the request models the server validates with).</p>
<div id="api">loading…</div>
<script>
function esc(s){return String(s).replace(/[&<>]/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;"})[c])}
function ty(s,d){if(!s)return"";if(s.$ref)return esc(s.$ref.split("/").pop());
 if(s.anyOf)return s.anyOf.map(x=>ty(x,d)).join(" | ");if(s.enum)return s.enum.map(JSON.stringify).join(" | ");
 if(s.const!==undefined)return JSON.stringify(s.const);if(s.type==="array")return ty(s.items,d)+"[]";
 return esc(s.type||"any")}
function fields(name,d){const s=d[name];if(!s||!s.properties)return"<p>"+ty(s,d)+"</p>";
 let h="<table><tr><th>field</th><th>type</th><th>default</th><th>what</th></tr>";
 for(const[k,v]of Object.entries(s.properties)){const req=(s.required||[]).includes(k);
  h+="<tr><td><code>"+esc(k)+"</code>"+(req?" (required)":"")+"</td><td>"+ty(v,d)+"</td><td>"+
  (v.default===undefined?"":esc(JSON.stringify(v.default)))+"</td><td>"+esc(v.description||"")+"</td></tr>"}
 return h+"</table>"}
fetch("openapi.json").then(r=>r.json()).then(spec=>{const d=spec.components.schemas;let h="";
 for(const[p,ops]of Object.entries(spec.paths))for(const[m,op]of Object.entries(ops)){
  h+="<h2><span class=m>"+m.toUpperCase()+"</span> <code>"+esc(p)+"</code></h2><p>"+esc(op.summary||"")+"</p>";
  const rb=op.requestBody&&op.requestBody.content["application/json"].schema.$ref;
  if(rb)h+="<h3>request</h3>"+fields(rb.split("/").pop(),d);
  h+="<h3>answers</h3><table>";for(const[c,r]of Object.entries(op.responses)){
   const ct=r.content&&Object.values(r.content)[0].schema;
   h+="<tr><td>"+c+"</td><td>"+esc(r.description)+"</td><td>"+(ct?ty(ct,d):"")+"</td></tr>"}
  h+="</table>"}
 document.getElementById("api").innerHTML=h});
</script></body></html>
"""

__all__ = ["build_spec", "DOCS_HTML", "ERRORS"]
