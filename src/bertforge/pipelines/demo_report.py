"""The demo report: one Markdown file with the results table, the stage log and two PNG plots.

* :func:`results_table` — one row per model: quality (Lee ρ and its retention of the teacher's, Pang–Lee
  accuracy, task metric when fine-tuned), latency (ms) and speed-up over the teacher, parameters (M),
  file size (MB); every header carries its unit.
* :func:`plot_loss_curves` — training loss against optimizer steps for each pretraining objective, read
  from each run's ``metrics.jsonl`` (raw, and divided by the first logged value so that objectives with
  different loss scales, e.g. ELECTRA's MLM + 50·RTD, share one axis).
* :func:`plot_quality_vs_latency` — one point per model: latency (ms, log scale) against quality.
* :func:`served_table` — the models served over HTTP on loopback (``bertforge serve-bench``): texts/s,
  latency p50/p95/p99 (ms) and throughput relative to the teacher.
* :func:`write_report` — ``report.md`` assembling all of it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from ..io import atomic_write_bytes, atomic_write_text


def read_loss_curve(metrics_path) -> tuple:
    """(steps, losses) of the training log records (those with ``step`` and ``loss``, not eval)."""
    steps, losses = [], []
    p = Path(metrics_path)
    if not p.is_file():
        return steps, losses
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "eval" in r or "loss" not in r or "step" not in r:
            continue
        v = float(r["loss"])
        if math.isfinite(v):
            steps.append(int(r["step"]))
            losses.append(v)
    return steps, losses


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_loss_curves(curves: dict, path, title: str = "Pretraining objectives at the same token budget") -> bool:
    """``curves``: objective name → (steps, losses). Writes a PNG with two panels; False if no data."""
    curves = {k: v for k, v in curves.items() if v[0]}
    if not curves:
        return False
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, (steps, losses) in curves.items():
        ax1.plot(steps, losses, marker=".", label=name)
        ax2.plot(steps, [v / losses[0] for v in losses], marker=".", label=name)
    ax1.set_yscale("log")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("training loss (nats, log scale)")
    ax1.set_title("loss")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("loss / first logged loss")
    ax2.set_title("relative loss")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def plot_quality_vs_latency(rows: list, path, quality_key: str = "lee_spearman",
                            quality_label: str = "Lee Spearman ρ (mean-pooled cosine vs human)") -> bool:
    """One labelled point per model that has both figures. False if none has."""
    pts = [(r["latency_ms"], r[quality_key], r["name"], r.get("backend", "")) for r in rows
           if r.get(quality_key) is not None and r.get("latency_ms")]
    if not pts:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    markers = {"torch": "o", "onnxruntime": "s"}
    for lat, q, name, be in pts:  # one legend entry per model: labels never overlap
        ax.scatter([lat], [q], marker=markers.get(be, "^"), s=60, label=f"{name} ({lat:.1f} ms, {q:.3f})")
    teacher = next((r for r in rows if r["name"] == "teacher" and r.get(quality_key) is not None), None)
    if teacher:
        ax.axhline(0.95 * teacher[quality_key], color="grey", ls="--", lw=0.8, label="95% of teacher")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xscale("log")
    ax.set_xlabel("latency, seq 128 × batch 1 (ms, p50, log scale) — ○ PyTorch FP32, □ ONNX Runtime")
    ax.set_ylabel(quality_label)
    ax.set_title("Quality vs latency, one point per model")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def _save(fig, path) -> None:
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write_bytes(Path(path), buf.getvalue())


def _fmt(v, spec: str, none: str = "—") -> str:
    return none if v is None else format(v, spec)


#: how the claims name each quality figure
QUALITY_LABELS = {"lee_spearman": "Lee ρ", "heldout_ndcg@10": "held-out retrieval NDCG@10"}

#: the embedding-quality columns that lead the table when the rows have them (embed-eval --heldout):
#: (row key, header, format, kept-vs-teacher column header or None)
AGREEMENT_COLUMNS = [
    ("heldout_ndcg@10", "held-out NDCG@10", ".3f", "NDCG@10 kept vs teacher (%)"),
    ("agreement_spearman", "teacher agreement ρ (pairwise cosines)", ".3f", None),
    ("agreement_overlap@10", "NN overlap@10 with teacher", ".3f", None),
]


def results_table(rows: list, teacher: str = "teacher") -> tuple:
    """Markdown table (str) and plain-text table (str) of the evaluation rows: the held-out agreement
    columns first (:data:`AGREEMENT_COLUMNS`, when measured), then Lee ρ, Pang–Lee accuracy, the task metric,
    latency, parameters and size."""
    t = next((r for r in rows if r["name"] == teacher), None)
    lead = [c for c in AGREEMENT_COLUMNS if any(r.get(c[0]) is not None for r in rows)]
    has_task = any(r.get("task_metrics") for r in rows)
    task_key = None
    if has_task:
        tm = next(r["task_metrics"] for r in rows if r.get("task_metrics"))
        task_key = next(iter(tm))
    head = ["model", "backend"]
    for key, label, _, kept in lead:
        head += [label] + ([kept] if kept else [])
    head += ["Lee ρ (Spearman)", "ρ kept vs teacher (%)", "Pang–Lee acc (%, 5-fold CV)"]
    if task_key:
        head += [f"{rows[0].get('task', 'task')} {task_key} (%)"]
    head += ["latency p50 (ms, seq 128, batch 1)", "speed-up vs teacher (×)", "params (M)", "size (MB)"]
    body = []
    for r in rows:
        keep = (100 * r["lee_spearman"] / t["lee_spearman"]
                if t and r.get("lee_spearman") is not None and t.get("lee_spearman") else None)
        acc = 100 * r["polarity_acc"] if r.get("polarity_acc") is not None else None
        line = [r["name"], r.get("backend", "")]
        for key, _, spec, kept in lead:
            line.append(_fmt(r.get(key), spec))
            if kept:
                line.append(_fmt(100 * r[key] / t[key] if t and r.get(key) is not None and t.get(key) else None,
                                 ".1f"))
        line += [_fmt(r.get("lee_spearman"), ".3f"), _fmt(keep, ".1f"),
                (f"{acc:.1f} ± {100 * r['polarity_acc_std']:.1f}" if acc is not None else "—")]
        if task_key:
            tm = r.get("task_metrics") or {}
            line.append(_fmt(100 * tm[task_key] if task_key in tm else None, ".1f"))
        sp = t["latency_ms"] / r["latency_ms"] if t and r.get("latency_ms") else None
        line += [_fmt(r.get("latency_ms"), ".2f"), _fmt(sp, ".2f"), _fmt(r["params"] / 1e6, ".2f"),
                 _fmt(r.get("size_mb"), ".1f")]
        body.append(line)
    md = "| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|\n"
    md += "".join("| " + " | ".join(b) + " |\n" for b in body)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    txt = "  ".join(h.ljust(w) for h, w in zip(head, widths)) + "\n"
    txt += "".join("  ".join(c.ljust(w) for c, w in zip(b, widths)) + "\n" for b in body)
    return md, txt


def checks(rows: list, student: str = "student-a", int8: str = "student-a-int8",
           teacher: str = "teacher", min_keep: float = 0.95, min_speedup: float = 1.8,
           onnx_fp32: str = "student-a-onnx", key: str = "lee_spearman", label: str = "Lee ρ",
           low_bit: str = "student-b", max_low_bit_size: float = 0.25) -> list:
    """The demo's claims, each ``{"claim", "value", "ok"}``: the student keeps ≥ 95% of the teacher's Lee ρ
    at ≥ 1.8× lower latency; its INT8 version keeps ≥ 95% and is faster still (than the student in
    PyTorch FP32, and than the same student in ONNX Runtime FP32 when that row exists); the second student
    (``low_bit``: the first one's weights at 4 bits, Q-BERT's group-wise grids) keeps ≥ 95% too in a file of
    ≤ 1/4 of the first one's FP32 size (4 of 32 bits, plus the scales, zero points and FP32 norms)."""
    by = {r["name"]: r for r in rows}
    out = []
    t, s, q, o = by.get(teacher), by.get(student), by.get(int8), by.get(onnx_fp32)
    if t and s and t.get(key) and s.get(key) is not None:
        keep = s[key] / t[key]
        sp = t["latency_ms"] / s["latency_ms"]
        out.append({"claim": f"{student} keeps ≥ {min_keep:.0%} of the teacher's {label}",
                    "value": f"{keep:.1%}", "ok": keep >= min_keep})
        out.append({"claim": f"{student} FP32 latency ≥ {min_speedup}× lower than the teacher's",
                    "value": f"{sp:.2f}× ({t['latency_ms']:.2f} → {s['latency_ms']:.2f} ms)",
                    "ok": sp >= min_speedup})
        if q and q.get(key) is not None:
            kq = q[key] / t[key]
            out.append({"claim": f"{int8} keeps ≥ {min_keep:.0%} of the teacher's {label}",
                        "value": f"{kq:.1%}", "ok": kq >= min_keep})
            out.append({"claim": f"{int8} is faster than {student} FP32",
                        "value": f"{s['latency_ms'] / q['latency_ms']:.2f}× ({s['latency_ms']:.2f} → "
                                 f"{q['latency_ms']:.2f} ms)", "ok": q["latency_ms"] < s["latency_ms"]})
            if o and o.get("latency_ms"):
                out.append({"claim": f"{int8} is faster than {onnx_fp32} (same graph, ONNX Runtime FP32)",
                            "value": f"{o['latency_ms'] / q['latency_ms']:.2f}× ({o['latency_ms']:.2f} → "
                                     f"{q['latency_ms']:.2f} ms)", "ok": q["latency_ms"] < o["latency_ms"]})
        lb = by.get(low_bit)
        if lb and lb.get(key) is not None:
            kb = lb[key] / t[key]
            out.append({"claim": f"{low_bit} (low-bit weights) keeps ≥ {min_keep:.0%} of the teacher's {label}",
                        "value": f"{kb:.1%}", "ok": kb >= min_keep})
            if s.get("size_mb") and lb.get("size_mb"):
                r = lb["size_mb"] / s["size_mb"]
                out.append({"claim": f"{low_bit}'s file is ≤ 1/{round(1 / max_low_bit_size)} of {student}'s FP32 "
                                     "file",
                            "value": f"1/{1 / r:.1f} ({s['size_mb']:.1f} → {lb['size_mb']:.1f} MB)",
                            "ok": r <= max_low_bit_size})
    return out


def served_table(served: dict, teacher: str = "teacher") -> tuple:
    """Markdown table (str) and plain-text table (str) of a ``bertforge serve-bench`` result (its JSON):
    one row per served model — requests, concurrency, texts per request, texts/s (texts in 200 answers per
    wall second), latency p50/p95/p99 (ms), answers other than 200, and texts/s relative to the teacher's."""
    rows = served.get("models") or []
    t = next((r for r in rows if r["name"] == teacher), None)
    head = ["served model", "requests", "concurrency", "texts/request", "texts/s", "p50 (ms)", "p95 (ms)",
            "p99 (ms)", "non-200", "texts/s vs teacher (×)"]
    body = []
    for r in rows:
        sp = r["texts_per_s"] / t["texts_per_s"] if t and t.get("texts_per_s") and r.get("texts_per_s") else None
        body.append([r["name"], str(r["requests"]), str(r["concurrency"]), str(r["texts_per_request"]),
                     _fmt(r.get("texts_per_s"), ".1f"), _fmt(r.get("p50_ms"), ".2f"), _fmt(r.get("p95_ms"), ".2f"),
                     _fmt(r.get("p99_ms"), ".2f"), str(r["requests"] - r["ok"]), _fmt(sp, ".2f")])
    md = "| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|\n"
    md += "".join("| " + " | ".join(b) + " |\n" for b in body)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    txt = "  ".join(h.ljust(w) for h, w in zip(head, widths)) + "\n"
    txt += "".join("  ".join(c.ljust(w) for c, w in zip(b, widths)) + "\n" for b in body)
    return md, txt


def write_report(out_dir, rows: list, stages: list, header: dict, loss_png: Optional[str],
                 quality_png: Optional[str], objective_rows: Optional[list] = None,
                 claims: Optional[list] = None, notes: Optional[list] = None,
                 served: Optional[dict] = None) -> str:
    """Write ``out_dir/report.md``; returns the plain-text results table (printed by the demo), followed by
    the served-models table when ``served`` (a ``serve-bench`` result) is given."""
    out_dir = Path(out_dir)
    md, txt = results_table(rows) if rows else ("_no model was evaluated_\n", "(no model was evaluated)\n")
    lines = ["# bertforge demo report", ""]
    for k, v in header.items():
        lines.append(f"- **{k}**: {v}")
    lines += ["", "## Results", "",
              *(["Embedding quality, measured on the corpus's held-out documents (no model trained on them): "
                 "each is cut into 3-sentence passages (up to 128) and every passage's middle sentence is a "
                 "query for the other two (NDCG@10 of that retrieval set, exact cosine search); teacher "
                 "agreement ρ: Spearman correlation between a model's and the teacher's cosine similarities "
                 "of all passage pairs; NN overlap@10: the mean share of each passage's 10 nearest passages "
                 "that the teacher also puts there. These lead because hundreds of texts and tens of "
                 "thousands of pairs carry them; the Lee ρ below rests on 50 documents and moves by several "
                 "points with noise (secondary).", ""]
                if any(r.get("heldout_ndcg@10") is not None for r in rows) else []),
              "Quality: Spearman ρ between the cosine similarity of mean-pooled last-layer embeddings and "
              "the mean human rating of the 1225 document pairs of gensim's Lee 50-document corpus; "
              "5-fold cross-validated logistic-regression accuracy on the 200 Pang–Lee polarity sentences "
              "(mean ± std over folds). Latency: one forward pass at sequence length 128, batch 1, median "
              "over interleaved rounds, on this machine's threads. Params: weights stored in the file "
              "(M = 10⁶). Size: file size (MB = 10⁶ bytes). ONNX rows run on ONNX Runtime.", "", md]
    if claims:
        lines += ["## Claims", "", "| claim | measured | met |", "|---|---|---|"]
        lines += [f"| {c['claim']} | {c['value']} | {'yes' if c['ok'] else 'NO'} |" for c in claims]
        lines.append("")
    if quality_png:
        lines += [f"![quality vs latency]({quality_png})", ""]
    if served:
        smd, stxt = served_table(served)
        srv = served.get("server") or {}
        lines += ["## Served on loopback", "",
                  f"The models above, served by `bertforge serve` over HTTP on 127.0.0.1 (one server process, "
                  f"`{srv.get('command', '')}`) and measured by a bounded burst of real requests "
                  f"({served.get('texts', '')}; {served.get('route', '')}; closed-loop clients, the models "
                  f"taking turns). texts/s: texts in 200 answers per wall second; latency: request sent → "
                  f"answer read, at the client, ms.", "", smd]
        txt += "\nserved on loopback (bertforge serve):\n" + stxt
    if objective_rows:
        lines += ["## Pretraining objectives at a glance", "",
                  "| objective | steps | first loss | last loss | last / first | run dir |", "|---|---|---|---|---|---|"]
        for o in objective_rows:
            lines.append(f"| {o['objective']} | {o.get('steps', '—')} | {_fmt(o.get('first'), '.3f')} | "
                         f"{_fmt(o.get('last'), '.3f')} | {_fmt(o.get('ratio'), '.2f')} | `{o.get('dir', '')}` |")
        lines.append("")
    if loss_png:
        lines += [f"![loss curves]({loss_png})", ""]
    lines += ["## Stages", "", "Each stage is an ordinary bertforge command with its own run dir; re-run any "
              "of them alone with the command shown.", "",
              "| stage | status | time (s) | command |", "|---|---|---|---|"]
    for s in stages:
        status = s["status"] + (f": {s['message']}" if s.get("message") else "")
        lines.append(f"| {s['name']} | {status.replace('|', '/')} | {_fmt(s.get('seconds'), '.1f')} | "
                     f"`{s['command']}` |")
    lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    atomic_write_text(out_dir / "report.md", "\n".join(lines))
    return txt


__all__ = ["QUALITY_LABELS", "AGREEMENT_COLUMNS", "read_loss_curve", "plot_loss_curves", "plot_quality_vs_latency", "results_table", "checks",
           "served_table", "write_report"]
