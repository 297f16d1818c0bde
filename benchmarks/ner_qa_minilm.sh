#!/usr/bin/env bash
# NER (CoNLL-2003 train → valid) and extractive QA (SQuAD v1.1 dev split by article) from the embedded
# MiniLM-L6-H384 checkpoint.
#
# On the shared 2-core CPU every process is budgeted to < 10 minutes, so a run is a chain of --resume
# segments (train.max_minutes each; the Trainer stops, checkpoints, and the next segment continues the
# same schedule, data order and optimizer state). The last NER segment evaluates on the full valid set;
# QA is evaluated by `bertforge evaluate` (EVAL_SAMPLES questions of the eval split; empty = all 2296).
# Results (commands + output) go to benchmarks/results/{ner_conll2003,squad_v11}_minilm.txt.
#
# Usage: benchmarks/ner_qa_minilm.sh [ner|qa|all]
#   WORK=/tmp/ner_qa  NER_SEGMENTS=4  QA_SEGMENTS=3  EVAL_SAMPLES=500   (nothing else is written in the repo)
# On an idle machine: QA_SEGMENTS=1 EVAL_SAMPLES= benchmarks/ner_qa_minilm.sh qa  (one 2-epoch run, all 2296
# eval questions: EM 55.4 / F1 68.4 in benchmarks/results/squad_v11_minilm.txt); NER_SEGMENTS=1 likewise.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
WORK=${WORK:-/tmp/ner_qa}
RES=benchmarks/results
WHAT=${1:-all}
NER_SEGMENTS=${NER_SEGMENTS:-4}
QA_SEGMENTS=${QA_SEGMENTS:-3}
EVAL_SAMPLES=${EVAL_SAMPLES-500}
mkdir -p "$WORK" "$RES"
# 1 intra-op thread: on the oversubscribed 2-core machine 2 threads were 3x slower per step (spin waits);
# bf16 autocast (AMX) was 1.6x cheaper per token than fp32; impl.dtype=auto keeps fp32 on CPUs without
# native bf16, where bf16 matmuls are emulated (~100x slower).
COMMON="impl.dtype=auto --no-progress impl.threads=1 train.save_every=100000 train.log_every=10"

run() {  # print the command, run it niced, keep its stdout (JSON) in the results file
  local out=$1; shift
  echo "\$ $*" | tee -a "$out"
  local t0=$(date +%s)
  nice -n 10 "$@" | tee -a "$out"
  echo "# wall: $(( $(date +%s) - t0 )) s" | tee -a "$out"
}

if [[ $WHAT == ner || $WHAT == all ]]; then
  out=$RES/ner_conll2003_minilm.txt
  echo "# CoNLL-2003 NER from MiniLM-L6-H384 ($(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg))" > "$out"
  for s in $(seq 1 "$NER_SEGMENTS"); do
    flags="--overwrite"; [[ $s -gt 1 ]] && flags="--resume"
    mins=8  # the last segment also evaluates on the full valid set (~2-3 min here)
    [[ $s -eq $NER_SEGMENTS ]] && flags="$flags --eval $DATA/conll2003/valid.txt" && mins=6
    run "$out" bertforge finetune --model minilm --task conll2003 --train $DATA/conll2003/train.txt \
        --out $WORK/ner $flags --max-seq-len 128 --batch-size 8 --lr 1.5e-4 --max-steps 240 $COMMON \
        train.warmup_steps=10 train.max_minutes=$mins train.eval_every=100000
  done
  echo "# training curve (metrics.jsonl)" >> "$out"
  cat $WORK/ner/metrics.jsonl >> "$out"
fi

if [[ $WHAT == qa || $WHAT == all ]]; then
  out=$RES/squad_v11_minilm.txt
  echo "# SQuAD v1.1 dev split by article, from MiniLM-L6-H384 ($(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg))" > "$out"
  run "$out" bertforge qa-split --data $DATA/squad/dev-v1.1.json --out-dir $WORK/squad
  if [[ $QA_SEGMENTS -eq 1 ]]; then  # idle machine: the run behind docs/ner_qa.md (2 epochs, ~69 min)
    run "$out" bertforge finetune --model minilm --task squad --train $WORK/squad/train.json --out $WORK/qa \
        --overwrite --max-seq-len 256 --batch-size 16 --lr 1e-4 --epochs 2 impl.dtype=auto --no-progress impl.threads=2 \
        train.warmup_steps=60 train.save_every=200 train.log_every=10 train.max_minutes=80
  else
    for s in $(seq 1 "$QA_SEGMENTS"); do
      flags="--overwrite"; [[ $s -gt 1 ]] && flags="--resume"
      run "$out" bertforge finetune --model minilm --task squad --train $WORK/squad/train.json --out $WORK/qa \
          $flags --max-seq-len 256 --batch-size 8 --lr 1e-4 --max-steps 200 $COMMON train.warmup_steps=10 \
          train.max_minutes=7.5
    done
  fi
  echo "# training curve (metrics.jsonl)" >> "$out"
  cat $WORK/qa/metrics.jsonl >> "$out"
  OMP_NUM_THREADS=1 run "$out" bertforge evaluate --model $WORK/qa --data $WORK/squad/eval.json \
      --max-seq-len 384 --batch-size 32 ${EVAL_SAMPLES:+--max-samples $EVAL_SAMPLES}
fi
