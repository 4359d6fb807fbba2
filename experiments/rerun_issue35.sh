#!/usr/bin/env bash
# Issue 35's re-runs on a 4-GPU machine (nvidia-h100-x4), 4 seeds each, with experiments/compare.py: the
# results made before the content split of the word problems, the split Search-R1 knowledge base and the
# ExGRPO buffer rules, with the no-model baselines and every step's training metrics in results.json.
#
#   bash benchmarks/run_gpu.sh setup1 setup2           # once per fresh machine (wheels, the SmolLM2 GGUF)
#   bash experiments/rerun_issue35.sh STAGE...          # one device call per stage (each < ~8 min)
#
# stages (expected wall time on 4 x H100, from the 2026-11-26 runs of the same settings):
#   exgrpo    (a) ExGRPO vs GRPO, 1-2 op arithmetic, 120 steps, 8 runs at 2 a GPU       ~6 min (was 347 s)
#             also grpo_arith's 4-seed headline (its GRPO arm)
#   masking   (b) Search-R1 masked vs unmasked, 30 steps, 8 runs at 2 a GPU            ~8 min (was 408 s for
#             33-38 steps; budget 470 s)
#   sr1       (c) Search-R1 alone vs combined: the base model's direct / RAG baselines (~1-2 min, cached in
#             the folder), then 8 runs of 30 steps at 2 a GPU                         ~8-9 min (budget 420 s)
#   luffy     (d) LUFFY five-way, 150 RL steps (sft_rl 50 + 150), 20 runs at 5 a GPU  ~13 min in two calls:
#             call it twice on the SAME machine (budget 480 s each; the second resumes the checkpoints)
# A stage cut by its budget is resumed by the same command on the same machine (complete runs return at
# once; a fresh machine starts them over). Each stage copies its results.json, RESULTS.md, plots and logs to
# $OUT/NAME as soon as it ends. Then, on the CPU machine, for NAME in exgrpo search_r1_masking search_r1 luffy:
#   cp OUT/NAME/{results.json,*.png} experiments/NAME/   (search_r1: also baselines.json)
#   paste OUT/NAME/RESULTS.md (compare.py's per-step tables) over the old ones in experiments/NAME/RESULTS.md
#   python -m experiments.report                         # regenerates README's table and every headline
# CPU check of the commands: SMOKE=1 MODEL=TINY_HF_FOLDER bash experiments/rerun_issue35.sh STAGE (seconds
# to minutes; one seed, smoke presets, runs in this process).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/root/work/issue35}
MODEL=${MODEL:-/root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
SEEDS=${SEEDS:-0 1 2 3}
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export FINEFLAX_CACHE=${FINEFLAX_CACHE:-/root/fineflax-cache} JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/root/jax-cache}
GPU_SET="model.remat=full model.logits_chunk=32"
LUFFY_SET="rl.prompts_per_step=16"  # the 2026-11-26 LUFFY runs' setting
if [ "${SMOKE:-0}" = 1 ]; then  # tiny model on a CPU: smoke presets, one seed, one run at a time in-process
  SEEDS=${SMOKE_SEEDS:-0}; SM=smoke; RUNNER="--in-process --smoke"; GPU_SET="lora.targets=('q','v')"; LUFFY_SET=""
  STEPS=${STEPS:-1}; EVAL_EVERY=${EVAL_EVERY:-1}
else
  SM=""; RUNNER=""
fi
mkdir -p "$OUT" "$WORK"

save() {  # save NAME: the stage's tables, results, plots and logs under $OUT/NAME
  local src="$WORK/$1"
  mkdir -p "$OUT/$1" && cp "$src"/*.md "$src"/*.json "$src"/*.png "$OUT/$1/" 2>/dev/null
  [ -d "$src/logs" ] && tar czf "$OUT/$1-logs.tgz" -C "$src" logs
  ls -la "$OUT/$1"
}

for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    exgrpo)
      python3 -m experiments.compare --config configs/grpo_arith.py --out "$WORK/exgrpo" \
        --method "grpo=$SM" --method "exgrpo=exgrpo${SM:+,$SM}" --seeds $SEEDS --per-gpu 2 ${RUNNER% --smoke} \
        --time-budget ${TIME_BUDGET:-470} --title "GRPO vs ExGRPO, SmolLM2-135M QLoRA, 1-2 step arithmetic" \
        --extra-metrics solve_rate reward_mean replay_share buffer_questions buffer_retired \
        --set model.source=$MODEL num_steps=${STEPS:-120} eval_every=${EVAL_EVERY:-20} $GPU_SET
      save exgrpo ;;
    masking)
      python3 -m experiments.compare --config configs/search_r1.py --out "$WORK/search_r1_masking" \
        --method "masked=$SM" --method "unmasked=$SM;search.mask_info=false" --seeds $SEEDS \
        --per-gpu 2 ${RUNNER% --smoke} --time-budget ${TIME_BUDGET:-470} --metric eval_em \
        --title "Search-R1 info-token masking ablation, SmolLM2-135M QLoRA" \
        --extra-metrics eval_em_1hop eval_em_2hop eval_searches reward_mean \
        --set model.source=$MODEL num_steps=${STEPS:-30} eval_every=${EVAL_EVERY:-10} $GPU_SET
      save search_r1_masking ;;
    sr1)
      python3 -m experiments.search_r1.run --model "$MODEL" --out "$WORK/search_r1" \
        --methods search_r1 combined --seeds $SEEDS --per-gpu 2 $RUNNER \
        --time-budget ${TIME_BUDGET:-420} --steps ${STEPS:-30} --eval-every ${EVAL_EVERY:-10} --set $GPU_SET
      save search_r1 ;;
    luffy)
      python3 -m experiments.luffy.run --model "$MODEL" --out "$WORK/luffy" --seeds $SEEDS \
        --per-gpu ${PER_GPU:-5} $RUNNER \
        --time-budget ${TIME_BUDGET:-480} --steps ${STEPS:-150} --eval-every ${EVAL_EVERY:-50} \
        --set $GPU_SET $LUFFY_SET
      save luffy ;;
    *) echo "unknown stage $stage (exgrpo masking sr1 luffy)"; exit 2 ;;
  esac
done
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.used --format=csv; fi
