"""Peer (c) of benchmarks/bench_serve.py: the plain way to serve embeddings — a FastAPI app whose handler
calls sentence-transformers' ``encode`` once per request (no batching across requests).

Runs in the benchmark's own environment (.venv-bench: sentence-transformers, fastapi, uvicorn), not in
bertforge's. Same request and answer as text-embeddings-inference's ``POST /embed``:
``{"inputs": str | [str], "normalize": bool}`` → ``[[float, ...], ...]``; ``GET /health`` → 200.

  python benchmarks/peers/st_fastapi.py --model DIR --port 8081 --threads 2
"""
import argparse
from typing import List, Union

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


class EmbedRequest(BaseModel):
    inputs: Union[str, List[str]]
    normalize: bool = True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = SentenceTransformer(a.model, device="cpu")
    model.encode(["warm up"])
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/embed")
    def embed(req: EmbedRequest):  # a plain (sync) handler: FastAPI runs it in its thread pool
        texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        return model.encode(texts, normalize_embeddings=req.normalize).tolist()

    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
