#!/usr/bin/env bash
# One prepared check of mini-trainer's GPU path, in about 21 minutes on one GPU (--parts: less).
#
#   benchmarks/gpu_check.sh [--out gpu_check.json] [--cpu-dry-run] [--parts NAME,NAME...]
#
# Parts (each under its own time limit; a failed or timed-out part is recorded and the rest
# still run; the JSON is always written):
#   tests           the fast test files that exercise attention, loss, collator, prefetch, flops
#                   (on a GPU machine they run with CUDA visible)
#   attention       every packed-attention path that imports (flash-attn, torch varlen,
#                   per-sample sdpa): packed == each sample alone, and one forward+backward time
#   families        every supported family's tiny model (tests/families.py) on every kernel
#                   its attention needs allow (windows, soft-caps, sinks): packed bf16 loss vs
#                   the fp32 eager per-sample reference
#   train_bf16      the demo training through torchrun on 1 GPU (bf16 FSDP2, the chosen
#                   attention, prefetch): loss falls, tokens/s, MFU from metrics.jsonl
#   train_liger     the same with --use-liger-kernels
#   train_compiled  the same with --compile (eager vs compiled: compare its tokens/s and MFU
#                   with train_bf16's; its first steps include the compile time)
#   throughput      a random-init ~1B Llama, packed rows against padded batches: tokens/s, MFU
#   train_lean      the demo training with bf16 parameters and 8-bit AdamW (torchao's kernels
#                   compiled for CUDA), a state saved mid-run
#   train_bf16_states  the same with bf16-state AdamW (pure torch, stochastic rounding)
#   train_offload_lean the same as train_lean with --cpu-offload (the 8-bit step on the host)
#   context_parallel   needs 8 GPUs (skipped with fewer; not in the 21.25 minutes): Llama-3.1-8B's
#                   config, random weights, one 131,072-token sample at --context-parallel 8,
#                   forward+backward tokens/s per GPU beside torchtitan's 1,071 per H100
#   train_ewc       ewc-fisher of the demo model, then the demo training with --method ewc
#   trace_generate  a TRACE fixture task as chat, the demo model's greedy answers (bf16 on the
#                   GPU, `mini-trainer generate`), TRACE's score of them (`trace-score`)
#   train_async     the demo training with async saves by default (no flag; the log's start
#                   line says on), a state every 10 steps (staged into pinned host memory from
#                   the GPU, written by the background thread)
#   train_deterministic  the demo training twice with --deterministic: the same bytes of final/
#                   and metrics (measured fields aside); its tok/s against train_bf16's is the
#                   flag's cost
# Then one JSON (--out) and a table on stdout. Exit status 1 if any part failed.
#
# --cpu-dry-run runs every part at tiny sizes on the CPU (fp32; Liger is expected to be refused
# there): it checks this script, not the GPU. Set PYTHON to choose the interpreter. --parts runs
# only the named parts (the training parts need demo_assets), e.g. the lean-state check alone:
#   --parts demo_assets,train_bf16,train_lean,train_bf16_states
set -euo pipefail

OUT="gpu_check.json"
DRY=""
ONLY=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --cpu-dry-run) DRY="--cpu-dry-run"; shift ;;
    --parts) ONLY="$2"; shift 2 ;;
    -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

PY="${PYTHON:-python}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
PARTS="$WORK/parts"
mkdir -p "$PARTS"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled
cd "$REPO"
FAILED=0

# run_part NAME TIMEOUT_S COMMAND...: run, time, record status and the output's tail.
run_part() {
  local name="$1" limit="$2"; shift 2
  if [[ -n "$ONLY" && ",$ONLY," != *",$name,"* ]]; then return 0; fi
  local log="$PARTS/$name.log" started status rc=0
  started=$(date +%s.%N)
  echo "== $name (limit ${limit}s)"
  if timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1; then
    status="ok"
  else
    rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then status="timeout"; else status="failed"; fi
    FAILED=1
  fi
  "$PY" - "$PARTS/$name.status.json" "$status" "$rc" "$started" "$log" <<'EOF'
import json, sys, time
path, status, rc, started, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-2000:]
json.dump({"status": status, "exit_code": int(rc), "seconds": time.time() - float(started),
           "tail": tail}, open(path, "w"), indent=2)
EOF
  echo "   $status"
}

# Time limits (seconds) sum to 21.25 minutes on a GPU (--parts for less); the CPU dry run gets more.
if [[ -n "$DRY" ]]; then
  STEPS=3; NPROC=1; T_TESTS=600; T_ATTN=600; T_DEMO=300; T_TRAIN=600; T_THROUGHPUT=600
  T_COMPILED=1800  # inductor builds C++ kernels on the CPU: minutes on 2 shared cores
  T_LEAN=1800      # torchao's 8-bit step compiles too
  T_TWICE=1200
else
  STEPS=40; NPROC=1; T_TESTS=90; T_ATTN=45; T_DEMO=30; T_TRAIN=75; T_THROUGHPUT=150
  T_COMPILED=120; T_LEAN=120; T_TWICE=150
fi

run_part tests "$T_TESTS" "$PY" -m pytest -q -x -p no:cacheprovider \
  tests/test_attention.py tests/test_packed_attention.py tests/test_loss.py \
  tests/test_batching_collator.py tests/test_prefetch.py tests/test_flops.py

run_part attention "$T_ATTN" "$PY" benchmarks/gpu_check.py attention --out "$PARTS/attention.json" $DRY

run_part families "$T_ATTN" "$PY" benchmarks/gpu_check.py families --out "$PARTS/families.json" $DRY

run_part demo_assets "$T_DEMO" "$PY" -m mini_trainer demo-assets --out "$WORK/demo"

train() {  # train NAME EXTRA_FLAGS...
  local name="$1"; shift
  "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" -m mini_trainer.train \
    --model-name-or-path "$WORK/demo/model" \
    --data-path "$WORK/demo/data/sort_plus1.train.jsonl" --output-dir "$WORK/$name" \
    --batch-size 32 --max-tokens-per-gpu 1024 --learning-rate 3e-3 --training-mode step \
    --max-steps "$STEPS" --save-final-checkpoint "$@" &&
  "$PY" benchmarks/gpu_check.py training --run "$WORK/$name" --out "$PARTS/$name.json"
}
export -f train
export PY WORK NPROC STEPS PARTS
run_part train_bf16 "$T_TRAIN" bash -c 'train train_bf16'
if [[ -n "$DRY" ]]; then
  # No Liger on the CPU: the run must be refused with the one-line error, and that passes.
  run_part train_liger "$T_TRAIN" bash -c \
    'train train_liger --use-liger-kernels 2>&1 | grep -q "needs a CUDA GPU"'
else
  run_part train_liger "$T_TRAIN" bash -c 'train train_liger --use-liger-kernels'
fi

run_part train_compiled "$T_COMPILED" bash -c 'train train_compiled --compile'

# Lean state: each run saves a state mid-run through torch.distributed.checkpoint.
run_part train_lean "$T_LEAN" bash -c \
  'train train_lean --optimizer adamw-8bit --param-dtype bf16 --save-every-steps $((STEPS / 2))'
run_part train_bf16_states "$T_TRAIN" bash -c \
  'train train_bf16_states --optimizer adamw-bf16 --param-dtype bf16 --save-every-steps $((STEPS / 2))'
# CPU offload with a lean mode: FSDP2 keeps the shards on the host, where the 8-bit step runs
# (torchao compiled for the CPU, as in the CPU tests). On the CPU the flag is refused in one line.
if [[ -n "$DRY" ]]; then
  run_part train_offload_lean "$T_TRAIN" bash -c \
    'train train_offload_lean --cpu-offload --optimizer adamw-8bit 2>&1 | grep -q "needs a CUDA device"'
else
  run_part train_offload_lean "$T_LEAN" bash -c \
    'train train_offload_lean --cpu-offload --optimizer adamw-8bit --param-dtype bf16'
fi

# EWC: the demo model's Fisher on sort (one process), then the demo training with the penalty
# on the GPU's shards (bf16 compute, fp32 Fisher and anchor): it trains, ewc_penalty is logged.
run_part train_ewc "$T_TRAIN" bash -c \
  '"$PY" -m mini_trainer ewc-fisher --model "$WORK/demo/model" --max-samples 64 --force \
     --data "$WORK/demo/data/sort.train.jsonl" --out "$WORK/ewc_fisher" &&
   train train_ewc --method ewc --ewc-lambda 1000 --ewc-fisher "$WORK/ewc_fisher"'

# TRACE: a fixture task as chat, the demo model's greedy answers on the GPU (bf16), TRACE's score.
run_part trace_generate "$T_DEMO" bash -c \
  '"$PY" -m mini_trainer trace-chat tests/fixtures/trace/NumGLUE-ds/test.json --force \
     --out "$WORK/trace/chat.jsonl" &&
   "$PY" -m mini_trainer generate --model "$WORK/demo/model" --data "$WORK/trace/chat.jsonl" \
     --out "$WORK/trace/pred.jsonl" --max-new-tokens 16 --force &&
   "$PY" -m mini_trainer trace-score --task NumGLUE-ds --predictions "$WORK/trace/pred.jsonl" \
     --data tests/fixtures/trace/NumGLUE-ds/test.json --out "$PARTS/trace_generate.json" --force'

# Asynchronous saves: the CUDA staging path (device-to-host copies into pinned memory).
# No flag: the default turns async saves on (the demo's state is tiny beside the node's
# MemAvailable), and rank 0 says so at the start.
run_part train_async "$T_TRAIN" bash -c \
  'set -o pipefail; train train_async --save-every-steps $(( STEPS / 4 > 0 ? STEPS / 4 : 1 )) 2>&1 | tee "$WORK/train_async.log" && grep -q "async save: on (default" "$WORK/train_async.log" && ls "$WORK/train_async/state"'

# Deterministic kernels: the same command twice gives the same bytes; tok/s against train_bf16's.
run_part train_deterministic "$T_TWICE" bash -c \
  'train train_deterministic_first --deterministic && train train_deterministic --deterministic &&
   "$PY" benchmarks/gpu_check.py training --run "$WORK/train_deterministic" \
     --same-as "$WORK/train_deterministic_first" --out "$PARTS/train_deterministic.json"'

run_part throughput "$T_THROUGHPUT" "$PY" benchmarks/gpu_check.py throughput --out "$PARTS/throughput.json" $DRY

# Context parallelism (docs/context_parallel.md): 8 GPUs, one 131,072-token sample, CP 8.
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [[ -n "$DRY" ]]; then
  run_part context_parallel "$T_TRAIN" "$PY" benchmarks/context_parallel.py --tokens 512 \
    --repeats 1 --out "$PARTS/context_parallel.json"
elif [[ "$GPUS" -ge 8 ]]; then
  run_part context_parallel 420 "$PY" benchmarks/context_parallel.py --gpu --nproc 8 \
    --tokens 131072 --repeats 2 --out "$PARTS/context_parallel.json"
else
  echo "== context_parallel: skipped ($GPUS GPU(s); it needs 8)"
fi

"$PY" benchmarks/gpu_check.py summarize --parts "$PARTS" --out "$OUT" $DRY
echo "wrote $OUT (logs in $PARTS)"
exit "$FAILED"
