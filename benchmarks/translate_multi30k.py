"""Multi30k en→de with the small translation Transformer: decode test_2016_flickr and report BLEU.

Reads a run dir written by `bertforge translate train` (see docs/translation.md for the training command),
decodes the test set with greedy search and with beam search (sacreBLEU, cased, detokenized, 13a), and
prints one report with the training wall time / CPU time / steps taken from the run's metrics.jsonl.

    python benchmarks/translate_multi30k.py --run /tmp/mt/run-small [--beams 5 1] \
        | tee benchmarks/results/translate.txt
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--split", default="test_2016_flickr")
    ap.add_argument("--beams", type=int, nargs="+", default=[5, 1])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import sacrebleu
    import torch

    from bertforge.data.translation import read_lines
    from bertforge.models.decoding import translate_texts
    from bertforge.models.seq2seq import TransformerSeq2Seq
    from bertforge.tokenizer import load_tokenizer
    torch.set_num_threads(args.threads)
    run = Path(args.run)
    model = TransformerSeq2Seq.from_pretrained(run).eval()
    tok = load_tokenizer(run)
    src = read_lines(Path(args.data) / f"{args.split}.en")
    ref = read_lines(Path(args.data) / f"{args.split}.de")
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in recs if "loss" in r]
    evals = [r for r in recs if "eval" in r]
    state = json.loads((run / "trainer_state.json").read_text()) if (run / "trainer_state.json").is_file() else {}
    last = train_recs[-1] if train_recs else {}
    print(f"# Multi30k en→de, {args.split} ({len(src)} sentences), model {run}")
    print(f"model: d_model={model.config.d_model} layers={model.config.encoder_layers}+"
          f"{model.config.decoder_layers} heads={model.config.num_heads} ffn={model.config.ffn_dim} "
          f"vocab={model.config.vocab_size} (joint BPE) params={model.num_parameters():,}")
    print(f"training: steps={last.get('step')} epoch={last.get('epoch')} wall_s={last.get('elapsed_s')} "
          f"cpu_s={last.get('cpu_s')} final_train_loss={last.get('loss')} "
          f"best_step={state.get('best_step')} (final model from {state.get('final_from')})")
    for e in evals:
        print(f"  eval step {e['step']}: " + " ".join(f"{k}={v:.3f}" for k, v in e["eval"].items()))
    for beam in args.beams:
        t0, c0 = time.perf_counter(), time.process_time()
        hyp = translate_texts(model, tok, src, beam=beam, length_penalty=0.6)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        metric = sacrebleu.BLEU()
        bleu = metric.corpus_score(hyp, [ref])
        print(f"beam={beam}: BLEU={bleu.score:.2f}  [{bleu}]  decode wall={wall:.1f}s cpu={cpu:.1f}s")
        print(f"  signature: {metric.get_signature()}")
        print(f"  sample: {src[0]!r} -> {hyp[0]!r} (ref {ref[0]!r})")


if __name__ == "__main__":
    main()
