#!/usr/bin/env bash
# The benchmarks on one GPU: the prepared script of a lent H100/H200, each part with its own
# timeout, the most telling parts first, all within GPU_SH_BUDGET seconds (default 400; a part
# that would start past it is skipped, one that would run past it is cut at the budget).
#
#   bash experiments/benchmarks/gpu.sh [--toy] [--full] [OUT_DIR]
#
# Results: OUT_DIR/*.json (default experiments/benchmarks/results/gpu), OUT_DIR/*.log, the traces
# and the AR loop's compiled HLO in OUT_DIR/dump/, and the table last on stdout (and in
# OUT_DIR/summary.txt): `bench.py gpu_summary --json OUT_DIR` prints it again.
#   1. decode: batch-1 AR with KV cache and block-model calls at GPT-2 small's size (12 x 768,
#      L 1024, V 50257, bfloat16), ms a network call; the AR loop unrolled, its weights stored in
#      bfloat16; a jax.profiler trace of the AR and block-4 calls (kernels a call, their time,
#      the host's) and the loop body's HLO ops.
#   2. train: SEDD small's step (owt_small, batch 32, no remat, no loss chunks, V unpadded) with
#      today's attention (mixed) and cuDNN's flash attention; MFU against 16 chained 8192^3
#      bf16 products in one jitted call (the chip's measured rate) and against the datasheet.
#   3. decode under XLA_FLAGS, each in its own process: as it comes, and with the while loop
#      in the command buffer (CUDA graphs). docs/benchmarks.md ("On a GPU") has an H200's figures.
#   4. speculative: the cost of one KV-cached AR call on n = 1..32 new positions at the default's
#      and GPT-2 small's sizes (bfloat16), batch 1: how many tokens a round must write to pay.
#   5. spec_train, spec_bench: the wide config's AR runs with and without its draft head trained here (450
#      steps each), and the default's AR run (the drafter), then the head run's chosen layout (its head's
#      drafts a round) and the wide AR run drafted for by the default's (k = 4) against AR with its KV cache,
#      interleaved, batch 1 and 4, temperature 1 and 0 (docs/speculative.md).
#      GPU_SH_PARTS="spec_train spec_bench" GPU_SH_BUDGET=580 runs the self-speculation study alone.
#   6. spec_default_train, spec_default_bench: the same at the default's width (not with --toy).
# On a machine without sedd's own needs installed: PYTHONPATH=<their wheels>:$PWD (the docs say which).
#   --full adds the older parts after these (sampler, diffusion vs AR, memory, owt_small as shipped).
# --toy runs every part at tiny sizes on any machine (a CPU's dry run, tests/test_gpu_script.py).
set -uo pipefail
{  # read whole before it runs: editing this file during a run cannot change the run
TOY=0; FULL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --toy) TOY=1; shift ;;
    --full) FULL=1; shift ;;
    *) break ;;
  esac
done
OUT="${1:-experiments/benchmarks/results/gpu}"
mkdir -p "$OUT/dump"
BUDGET="${GPU_SH_BUDGET:-400}"
PY="${PYTHON:-python3}"
B="$PY experiments/benchmarks/bench.py"
START=$SECONDS
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null \
  || echo "no nvidia-smi: not a GPU machine"
$PY -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"

# part NAME TIMEOUT_S [ENV=VALUE ...] -- COMMAND ...: runs COMMAND with its timeout cut to the budget left.
part() {
  local name=$1 limit=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if [ -n "${GPU_SH_PARTS:-}" ] && [[ " $GPU_SH_PARTS " != *" $name "* ]]; then return; fi
  local left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt 20 ]; then echo "== $name: skipped, ${left} s of the budget left"; return; fi
  limit=$((limit * SCALE))
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (timeout ${limit} s) ${envs[*]:-}"
  local t0=$SECONDS
  env "${envs[@]}" timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "== $name: exit $rc after $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (timed out)')"
}

SCALE=1  # the toy's parts on a small shared CPU take longer than the GPU's
if [ "$TOY" = 1 ]; then
  SCALE=4
  DECODE="--quick --unroll 2 --block_sizes 4"
  DECODE_FLAGS="--quick --unroll --no_block"
  TRAIN="--quick --peak_iters 2"
  SPEC="--quick --cost_only"
  SPEC_TRAIN="--config.training.n_iters=3 --config.training.eval_every=3 --config.training.ckpt_every=3 \
--config.training.batch_size=4 --config.model.hidden_size=64 --config.model.n_heads=2 --config.data.seq_len=32"
  SPEC_BENCH="--layouts auto --quality_samples 4 --repeats 1 --batch_sizes 1"
else
  DECODE="--width 768 --blocks 12 --seq_len 1024 --length 1024 --dtype bfloat16 --repeats 3 --unroll 4 --block_sizes 4 16"
  DECODE_FLAGS="--width 768 --blocks 12 --seq_len 1024 --length 1024 --dtype bfloat16 --repeats 2 --unroll --block_sizes 4"
  TRAIN="--config owt_small --batch_sizes 32 --config.model.remat=none --config.training.loss_chunk=0
    --config.model.vocab_multiple=1 --dtype bfloat16 --matmul_n 8192 --peak_iters 16 --repeats 5 --no_profile"
  SPEC="--cost_only --dtype bfloat16 --repeats 5"
  SPEC_TRAIN=""
  SPEC_BENCH="--layouts auto 4 2 --quality_samples 64 --repeats 5 --batch_sizes 1 4"
fi

# 1. Decode at batch 1, traced.
part decode 150 -- $B decode $DECODE --trace --dump "$OUT/dump" --json "$OUT/decode.json"
# 2. The training step, today's attention and cuDNN's.
part train_attention 150 -- $B train $TRAIN --attention mixed cudnn --json "$OUT/train_attention.json"
# 3. Decode under XLA_FLAGS, each in its own process: as it comes, then with the while loop inside the
#    command buffer (CUDA graphs) and graphs of any size. (jax 0.10-0.11 have no flag to keep XLA from
#    rewriting a one-row product into a multiply writing the f32 [H_in, H_out] products and a reduction
#    reading them, which the trace of part 1 shows to be most of a decode call.)
CMD_ALL="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
part decode_flags_default 120 XLA_FLAGS="${XLA_FLAGS:-}" -- $B decode $DECODE_FLAGS --json "$OUT/decode_flags_default.json"
part decode_flags_while 120 XLA_FLAGS="${XLA_FLAGS:-} $CMD_ALL --xla_gpu_graph_min_graph_size=1" -- \
  $B decode $DECODE_FLAGS --json "$OUT/decode_flags_while.json"
# 4. Speculative sampling's call-cost curve: one AR call on n new positions, n = 1..32, two sizes.
part speculative 150 -- $B speculative $SPEC --json "$OUT/speculative.json"
# 5. Drafts against AR, trained here: the wide config (docs/speculative.md) with its draft head and without.
RUNS="${GPU_SH_RUNS:-${OUT%/}.runs}"  # beside OUT, not in it: two checkpoints of 26M parameters and their optimizer state
echo "runs of part 5 in $RUNS"
part spec_train 300 -- bash -c "$PY -m sedd.cli train --config shakespeare_wide --workdir $RUNS/wide_head $SPEC_TRAIN &&
  $PY -m sedd.cli train --config shakespeare_wide --workdir $RUNS/wide_ar --config.model.draft_head=0 $SPEC_TRAIN &&
  $PY -m sedd.cli train --workdir $RUNS/small_ar --config.model.kind=ar $SPEC_TRAIN"
part spec_bench 300 -- $B speculative --target "$RUNS/wide_ar" --drafts "$RUNS/small_ar" --draft_ks 4 \
  --spec "$RUNS/wide_head" --temperatures 1 0 $SPEC_BENCH --json "$OUT/spec_runs.json"
# 6. The same at the default's width (on a CPU no layout pays there; on a GPU a call on a few positions may cost
#    about one), last: the budget skips it first. Not in the toy run (the same code as part 5).
if [ "$TOY" = 0 ]; then
  part spec_default_train 150 -- bash -c "$PY -m sedd.cli train --workdir $RUNS/default_spec --config.model.kind=spec &&
    $PY -m sedd.cli train --workdir $RUNS/default_ar --config.model.kind=ar"
  part spec_default_bench 200 -- $B speculative --target "$RUNS/default_ar" --drafts none --spec "$RUNS/default_spec" \
    --temperatures 1 0 --layouts auto 1,2 4,1 --quality_samples 64 --repeats 5 --batch_sizes 1 4 \
    --json "$OUT/spec_runs_default.json"
fi

if [ "$FULL" = 1 ] && [ "$TOY" = 0 ]; then
  part sampler 90 -- $B sampler --batch 64 --batch_gpt2 32 --dtype bfloat16 --repeats 7 --json "$OUT/sampler_gpu.json"
  part diffusion_vs_ar 180 -- $B ar --width 768 --blocks 12 --seq_len 1024 --batch_sizes 1 64 --dtype bfloat16 \
    --max_direct_steps 256 --json "$OUT/diffusion_vs_ar_gpu.json"
  part memory 60 -- $B memory --json "$OUT/memory_gpu.json"
  part owt_small_step 180 -- $B train --config owt_small --batch_sizes 64 --matmul_n 8192 --peak_iters 16 \
    --repeats 3 --json "$OUT/owt_small_step_gpu.json"
fi

echo "== gpu.sh: $((SECONDS - START)) s in all"
$B gpu_summary --json "$OUT" | tee "$OUT/summary.txt"
exit
}
