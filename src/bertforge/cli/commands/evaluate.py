"""Evaluate a fine-tuned checkpoint (or its ONNX / INT8 export) on a labelled file; prints one JSON object
of metrics. The model is run by :mod:`bertforge.runtime`.

Example:
  bertforge evaluate --model runs/sst2 --task sst2 --data dev.tsv
"""
from __future__ import annotations

import sys
import time

from ...errors import ConfigError, require_at_least
from ._common import print_json, resolve_model_dir


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="fine-tuned checkpoint dir")
    p.add_argument("--task", help="task name (default: the task the model was fine-tuned on)")
    p.add_argument("--data", required=True, help="labelled file (TSV/CSV/JSONL) or hub dataset name")
    p.add_argument("--max-seq-len", type=int, help="default: the fine-tuning length")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-samples", type=int)
    add_multilabel_args(p)


def add_multilabel_args(p) -> None:
    """``--threshold`` / ``--labels-file`` of a multi-label model (``evaluate``, ``predict``)."""
    p.add_argument("--threshold", metavar="T",
                   help="multi-label: predict a label when its probability >= T, instead of the thresholds "
                        "saved in the model dir (a number, or a JSON list / object label -> threshold)")
    p.add_argument("--labels-file", metavar="FILE",
                   help="multi-label: label names, one per line; checked to be the model's labels in order")


def load_for_task(model_arg, task_name, max_seq_len=None, threshold=None, labels_file=None):
    """(model dir, task, adapter, runner) for a fine-tuned checkpoint, or for what ``export`` / ``quantize``
    made of one: the :class:`~bertforge.runtime.base.Runner` that :func:`bertforge.runtime.load_runner` picks
    for the dir (PyTorch FP32 / INT8, or ONNX Runtime over its ``model.onnx``). ``max_seq_len`` None → the
    length the model was fine-tuned with. Raises ConfigError for a length outside [2, the model's
    positions], an unknown task or a head that does not fit the task; CheckpointError for an unusable dir."""
    from ...checkpoint.read import check_seq_len, read_config, require_saved_head
    from ...runtime import load_runner
    from ...tasks import adapter_for, model_task
    from ...tokenizer import load_tokenizer
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
    any_encoder = getattr(adapter, "reads_any_encoder", False)  # e.g. retrieval: embeddings of any encoder
    if adapter.head != "base" and not any_encoder:
        require_saved_head(cfg, adapter.head, str(model_dir), task.name, "pass the task it was fine-tuned on")
    runner = load_runner(model_dir)  # the saved head, which is the adapter's (checked above)
    n_out = runner.num_labels if adapter.head != "base" and not any_encoder else None
    if n_out and task.num_labels and n_out != task.num_labels:
        raise ConfigError(f"{model_dir} predicts {n_out} labels but task {task.name} has "
                          f"{task.num_labels}; pass the task it was fine-tuned on")
    if hasattr(adapter, "use_model_labels"):  # label set learnt at fine-tuning (e.g. task ner)
        adapter.use_model_labels(model_dir)
    if hasattr(adapter, "use_model_thresholds"):  # multi-label: the thresholds saved in the dir
        adapter.use_model_thresholds(model_dir)
    elif threshold is not None or labels_file is not None:
        raise ConfigError(f"--threshold and --labels-file apply to multi-label models; {model_dir} is a "
                          f"{task.kind} model")
    if labels_file is not None:
        from ...tasks.multilabel import check_labels_file
        check_labels_file(labels_file, saved or task.labels)
    if threshold is not None:
        from ...tasks.multilabel import resolve_thresholds
        adapter.thresholds = resolve_thresholds(threshold, task.labels, base=adapter.thresholds)
    return model_dir, task, adapter, runner


def run(args) -> int:
    require_at_least("--batch-size", args.batch_size, 1)
    require_at_least("--max-samples", args.max_samples, 1)
    model_dir, task, adapter, runner = load_for_task(args.model, args.task, args.max_seq_len,
                                                     getattr(args, "threshold", None),
                                                     getattr(args, "labels_file", None))
    data = adapter.load(args.data, args.max_samples)
    t0 = time.perf_counter()
    metrics = adapter.evaluate(runner, data, args.batch_size)
    from ._report import collapse_message
    warning = collapse_message(metrics, task)
    if warning:
        print(f"bertforge evaluate: {warning}", file=sys.stderr)
    if "constant_macro_f1" in metrics and metrics["macro_f1"] <= metrics["constant_macro_f1"]:
        print(f"bertforge evaluate: warning: macro-F1 {metrics['macro_f1']:.4g} is no better than the constant "
              f"predictor's {metrics['constant_macro_f1']:.4g} (every label for every row): the model has "
              f"collapsed — more steps, another learning rate, train.pos_weight=sqrt", file=sys.stderr)
    # token tasks batch windows; n counts the source sentences / questions
    print_json({"task": task.name, "n": len(getattr(data, "examples", data)), **metrics,
                "eval_seconds": round(time.perf_counter() - t0, 3)})
    return 0
