"""Evaluate a fine-tuned checkpoint on a labelled file; prints one JSON object of metrics.

Example:
  bertforge evaluate --model runs/sst2 --task sst2 --data dev.tsv
"""
from __future__ import annotations

import time

import torch

from ..adapters import adapter_for
from ..data.tasks import model_task
from ..errors import ConfigError, require_at_least
from ..hf import check_seq_len, deployed_format, load_pretrained, read_config, require_saved_head
from ..kernels import apply_kernels
from ..tokenizer import load_tokenizer
from ._common import print_json, resolve_model_dir


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="fine-tuned checkpoint dir")
    p.add_argument("--task", help="task name (default: the task the model was fine-tuned on)")
    p.add_argument("--data", required=True, help="labelled file (TSV/CSV/JSONL) or hub dataset name")
    p.add_argument("--max-seq-len", type=int, help="default: the fine-tuning length")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-samples", type=int)


def load_for_task(model_arg, task_name, max_seq_len=None):
    """(model dir, task, adapter, model) for a fine-tuned checkpoint, or for what ``export`` / ``quantize`` made
    of one (the model is then an :class:`~bertforge.compress.onnx.OrtModel` over its ``model.onnx``, or the
    PyTorch INT8 model). ``max_seq_len`` None → the length the
    model was fine-tuned with. Raises ConfigError for a length outside [2, the model's positions], an
    unknown task or a head that does not fit the task; CheckpointError for an unusable dir."""
    require_at_least("--max-seq-len", max_seq_len, 2)
    model_dir = resolve_model_dir(model_arg)
    cfg = read_config(model_dir)
    check_seq_len(max_seq_len, cfg)
    meta = cfg.get("bertforge") or {}
    name = task_name or meta.get("task")
    if not name:
        raise ConfigError(f"{model_dir} does not record its task; pass --task NAME")
    task = model_task(name, meta, model_dir)
    trained_on = meta.get("task")
    saved = [str(v) for _, v in sorted((cfg.get("id2label") or {}).items(), key=lambda kv: int(kv[0]))]
    if task_name and trained_on and task_name != trained_on and task.labels and saved \
            and task.kind != "qa" \
            and [str(x) for x in task.labels] != saved:  # same count, other names: a positional mismatch
        # (QA's two outputs are start/end logits whatever id2label says: squad ↔ squad_v2 is no mismatch)
        raise ConfigError(f"{model_dir} was fine-tuned on task {trained_on} (labels {', '.join(saved)}), not "
                          f"{task_name} (labels {', '.join(map(str, task.labels))}); pass --task {trained_on} "
                          f"or fine-tune on {task_name}")
    tok = load_tokenizer(model_dir)
    adapter = adapter_for(task, tok, max_seq_len if max_seq_len is not None else meta.get("max_seq_len") or 128)
    if adapter.head != "base":
        require_saved_head(cfg, adapter.head, str(model_dir), task.name, "pass the task it was fine-tuned on")
    held = deployed_format(model_dir)  # an export / quantize output: score the graph or INT8 model itself
    if held is None:
        model = load_pretrained(model_dir, head=adapter.head)
        n_out = getattr(model.head, "num_labels", None) if adapter.head != "base" else None
    else:
        if held[1] == "onnxruntime":
            from ..compress.onnx import OrtModel
            model = OrtModel(model_dir)
        else:
            from ..compress.quantize import load_quantized
            model = load_quantized(model_dir)
        n_out = len(cfg.get("id2label") or {}) or cfg.get("num_labels") if adapter.head != "base" else None
    if n_out and task.num_labels and n_out != task.num_labels:
        raise ConfigError(f"{model_dir} predicts {n_out} labels but task {task.name} has "
                          f"{task.num_labels}; pass the task it was fine-tuned on")
    if hasattr(adapter, "use_model_labels"):  # label set learnt at fine-tuning (e.g. task ner)
        adapter.use_model_labels(model if held is None else model_dir)
    if isinstance(model, torch.nn.Module):
        apply_kernels(model, "auto")  # speed only (bertforge.kernels)
    return model_dir, task, adapter, model


def run(args) -> int:
    require_at_least("--batch-size", args.batch_size, 1)
    require_at_least("--max-samples", args.max_samples, 1)
    model_dir, task, adapter, model = load_for_task(args.model, args.task, args.max_seq_len)
    data = adapter.load(args.data, args.max_samples)
    t0 = time.perf_counter()
    metrics = adapter.evaluate(model, data, args.batch_size)
    # token tasks batch windows; n counts the source sentences / questions
    print_json({"task": task.name, "n": len(getattr(data, "examples", data)), **metrics,
                "eval_seconds": round(time.perf_counter() - t0, 3)})
    return 0
