#!/usr/bin/env bash
# The benchmarks on one GPU, sized to finish in under 15 minutes on an
# H100/H200 (each step has its own timeout, so one slow part cannot eat the rest).
# Run from the repository root:  bash experiments/benchmarks/gpu.sh [OUT_DIR]
# Results: OUT_DIR/*.json (default experiments/benchmarks/results) and the
# tables on stdout; copy them into docs/benchmarks.md.
set -uo pipefail
OUT="${1:-experiments/benchmarks/results}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
B="python experiments/benchmarks/bench.py"

# Training: SEDD small's body (12 x 768, L 1024) in bfloat16, MFU against a
# bfloat16 8192^3 matmul timed in the same rounds.
timeout 150 $B train --width 768 --blocks 12 --seq_len 1024 --batch_sizes 8 32 \
  --dtype bfloat16 --matmul_n 8192 --repeats 5 --json "$OUT/train_gpu.json" || echo "train: failed or timed out"

# Sampler overhead: the char model and a GPT-2-vocabulary model, larger batches.
timeout 90 $B sampler --batch 64 --batch_gpt2 32 --dtype bfloat16 --repeats 7 \
  --json "$OUT/sampler_gpu.json" || echo "sampler: failed or timed out"

# Diffusion vs AR (KV cache) at SEDD small's size, L 1024, batch 1 and 64;
# steps up to 256 timed, 1024 from the median time per network call.
timeout 180 $B ar --width 768 --blocks 12 --seq_len 1024 --batch_sizes 1 64 --dtype bfloat16 \
  --max_direct_steps 256 --json "$OUT/diffusion_vs_ar_gpu.json" || echo "ar: failed or timed out"

# Memory of the compiled train step of every shipped config (no allocation).
timeout 60 $B memory --json "$OUT/memory_gpu.json" || echo "memory: failed or timed out"

# owt_small's own step at its per-device batch (64 x 1024; its remat, loss chunks and padded
# vocabulary as shipped; 34.9 GiB a device by the CPU compiler's plan, docs/scaling.md): tokens/s,
# MFU and the GPU's peak memory. Then without remat, where one device's memory allows it.
timeout 180 $B train --config owt_small --batch_sizes 64 --matmul_n 8192 --repeats 3 \
  --json "$OUT/owt_small_step_gpu.json" || echo "owt_small step: failed or timed out"
timeout 180 $B train --config owt_small --batch_sizes 64 --matmul_n 8192 --repeats 3 --config.model.remat=none \
  --json "$OUT/owt_small_step_noremat_gpu.json" || echo "owt_small step without remat: failed or timed out"
