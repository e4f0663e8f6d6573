#!/usr/bin/env bash
# The frontier's runs on one corpus, then the frontier (docs/benchmarks.md, "The frontier"):
#
#   bash experiments/benchmarks/frontier_runs.sh plays [DIR]     # the default's width on the plays
#   bash experiments/benchmarks/frontier_runs.sh code [DIR]      # the same on the standard library's code
#   bash experiments/benchmarks/frontier_runs.sh wide [PLAYS_DIR [DIR]]  # the plays at width 1024: shakespeare_wide
#                                        # and its block run (shakespeare_wide_block), judged by the plays' judge
#   bash experiments/benchmarks/frontier_runs.sh code_wide [CODE_DIR [DIR]]  # the same on code: code_wide and
#                                        # code_wide_block, judged by code's judge
#
# Each run is trained once (a run with a `.done` file is kept), into DIR (default runs/frontier_CORPUS); the
# frontier is measured last and writes DIR/frontier.{json,md,png}. Every run but wide's and code_wide's is of the
# default's width (4 x 128); the minutes each took on a 2-core Zen 3 are in docs/studies/frontier.md.
#   ar        the AR baseline, the default's steps (plays 1,500, code 1,000), continued 500 (code 400) steps
#             at a lower rate into ar_more: the baseline, of the block run's training budget
#   block4    a token-shifted block run (b = 4, AR-aligned) started from `ar` and trained as long as ar_more
#   head      `ar` continued with a draft head of 64, as long as ar_more
#   spec      the spec kind, k = 4, 600 steps
#   ddit      SEDD, the default's steps; distilled (plays only), one round of self-distillation of it
#             (128 -> 64 steps)
#   judge     an AR run trained 4x (code 2x) `ar`'s steps, 3x (1.4x) the baseline's: the independent judge,
#             never measured
set -euo pipefail
corpus=${1:?give plays, code, wide or code_wide}
t() {  # t NAME sedd-subcommand ARGS...: once, into $R/NAME
  local name=$1; shift
  [ -f "$R/$name/.done" ] && return
  echo "== $name: sedd $*"
  sedd "$@" && touch "$R/$name/.done"
}
if [ "$corpus" = wide ] || [ "$corpus" = code_wide ]; then  # an AR run with a draft head, its block run (b = 4)
  if [ "$corpus" = wide ]; then P=${2:-runs/frontier_plays} W=shakespeare_wide name="the plays"
  else P=${2:-runs/frontier_code} W=code_wide name=code; fi
  [ -f "$P/judge/.done" ] || { echo "frontier_runs.sh $corpus: train $P's runs first (its judge)" >&2; exit 2; }
  R=${3:-runs/frontier_$corpus}
  mkdir -p "$R"
  t wide_head train --workdir "$R/wide_head" --config $W
  t block4 train --workdir "$R/block4" --config ${W}_block --config.training.init_from="$R/wide_head" \
    --config.training.n_iters=450 --config.training.eval_every=450  # 3x the config's 150 (judged NLL +28% -> +19% over AR)
  exec python experiments/benchmarks/bench.py frontier --workdirs "$R/wide_head" "$R/block4" --judge "$P/judge" \
    --batch_sizes 1 4 --quality_samples 32 --json "$R/frontier.json" --picture "$R/frontier.png" \
    --title "Every decoder against AR: $name, 2 x 1024"
fi
case $corpus in
  plays) C=(); more=500; judge=6000 ;;
  code) C=(--config code); more=400; judge=2000 ;;
  *) echo "frontier_runs.sh: the corpus is plays, code, wide or code_wide, not '$corpus'" >&2; exit 2 ;;
esac
R=${2:-runs/frontier_$corpus}
mkdir -p "$R"
FT=(--config.training.n_iters=$more --config.training.eval_every=$more --config.training.ckpt_every=$more
  --config.optim.lr=1e-3 --config.optim.warmup=50)
t ar train --workdir "$R/ar" "${C[@]}" --config.model.kind=ar
t ar_more train --workdir "$R/ar_more" "${C[@]}" --config.model.kind=ar --config.training.init_from="$R/ar" "${FT[@]}"
t block4 train --workdir "$R/block4" "${C[@]}" --config.model.kind=block --config.model.block_size=4 \
  --config.model.token_shift=true --config.model.time_conditioning=false --config.training.init_from="$R/ar" "${FT[@]}"
t judge train --workdir "$R/judge" "${C[@]}" --config.model.kind=ar --config.training.n_iters=$judge \
  --config.training.eval_every=$judge --config.training.ckpt_every=$((judge / 2))
t head train --workdir "$R/head" "${C[@]}" --config.model.kind=ar --config.model.draft_head=64 \
  --config.training.draft_target=causal --config.training.init_from="$R/ar" "${FT[@]}"
t spec train --workdir "$R/spec" "${C[@]}" --config.model.kind=spec --config.model.draft_k=4 \
  --config.training.n_iters=600 --config.training.eval_every=600
t ddit train --workdir "$R/ddit" "${C[@]}"
runs=("$R/ar_more" "$R/block4" "$R/head" "$R/spec" "$R/ddit")
if [ "$corpus" = plays ]; then
  t distilled distill --teacher "$R/ddit" --workdir "$R/distilled" --rounds 1 --config.distill.round_steps=300
  runs+=("$R/distilled")
fi
python experiments/benchmarks/bench.py frontier --workdirs "${runs[@]}" --judge "$R/judge" --batch_sizes 1 4 \
  --samplers analytic entropy_bound left_to_right euler --steps 16 64 128 \
  --json "$R/frontier.json" --picture "$R/frontier.png" --title "Every decoder against AR: $corpus, 4 x 128"
