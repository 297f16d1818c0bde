#!/usr/bin/env bash
# NER (CoNLL-2003 train → valid) and extractive QA (SQuAD v1.1 dev split by article) from the embedded
# MiniLM-L6-H384 checkpoint. Each run is budgeted (train.max_minutes) to stay under 10 minutes on a shared
# CPU; results (with the commands) go to benchmarks/results/{ner_conll2003,squad_v11}_minilm.txt.
#
# Usage: benchmarks/ner_qa_minilm.sh [ner|qa|all]   (WORK=/tmp/ner_qa by default; nothing is written
# into the repo except the two results files)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
WORK=${WORK:-/tmp/ner_qa}
RES=benchmarks/results
WHAT=${1:-all}
mkdir -p "$WORK" "$RES"
# 1 intra-op thread: on an oversubscribed 2-core machine 2 threads were 3x slower per step (spin waits)
COMMON="--bf16 --no-progress impl.threads=1"

run() {  # print the command, run it niced, keep stdout (JSON) in the results file
  local out=$1; shift
  echo "\$ $*" | tee -a "$out"
  local t0=$(date +%s)
  nice -n 10 "$@" | tee -a "$out"
  echo "# wall: $(( $(date +%s) - t0 )) s" | tee -a "$out"
}

if [[ $WHAT == ner || $WHAT == all ]]; then
  out=$RES/ner_conll2003_minilm.txt
  echo "# CoNLL-2003 NER from MiniLM-L6-H384 ($(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg))" > "$out"
  run "$out" bertforge finetune --model minilm --task conll2003 --train $DATA/conll2003/train.txt \
      --eval $DATA/conll2003/valid.txt --out $WORK/ner --overwrite --max-seq-len 128 --batch-size 16 \
      --lr 1.5e-4 --max-steps 80 $COMMON train.max_minutes=7 train.eval_every=1000 train.save_every=1000 \
      train.log_every=5
  echo "# training curve (metrics.jsonl)" >> "$out"
  cat $WORK/ner/metrics.jsonl >> "$out"
fi

if [[ $WHAT == qa || $WHAT == all ]]; then
  out=$RES/squad_v11_minilm.txt
  echo "# SQuAD v1.1 dev split by article, from MiniLM-L6-H384 ($(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg))" > "$out"
  run "$out" bertforge qa-split --data $DATA/squad/dev-v1.1.json --out-dir $WORK/squad
  run "$out" bertforge finetune --model minilm --task squad --train $WORK/squad/train.json --out $WORK/qa \
      --overwrite --max-seq-len 256 --batch-size 16 --lr 1e-4 --max-steps 120 $COMMON train.max_minutes=8 \
      train.save_every=1000 train.log_every=5
  echo "# training curve (metrics.jsonl)" >> "$out"
  cat $WORK/qa/metrics.jsonl >> "$out"
  run "$out" bertforge evaluate --model $WORK/qa --data $WORK/squad/eval.json --max-seq-len 384 --batch-size 32
fi
