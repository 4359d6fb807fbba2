#!/usr/bin/env bash
# How the GPU numbers in benchmarks/RESULTS.md and experiments/*/RESULTS.md were produced, stage by stage,
# on a machine prepared by ../shared/tools/device-prep.sh (wheels in .whl/, the SmolLM2 GGUF in two halves).
#   bash benchmarks/run_gpu.sh STAGE...   stages: setup1 setup2 bench sampler sweep grpo search_r1 luffy
#                                          cudnn exgrpo masking agents apo serve pack
#                                          scaling mp2 (multi-GPU machines: nvidia-h100-x2 / -x4)
# Outputs go to $OUT (default /tmp/out): benchmarks/RESULTS.md and, per experiment, its RESULTS.md, plots
# and metrics JSON (run folders with checkpoints stay in /root/work).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
GGUF=/root/models/SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export FINEFLAX_CACHE=/root/fineflax-cache JAX_COMPILATION_CACHE_DIR=/root/jax-cache
mkdir -p "$OUT"
# an experiment that fails with cuDNN attention is run again with the XLA attention path
retry_xla() { "$@" || { echo "retrying with FINEFLAX_ATTENTION=xla"; FINEFLAX_ATTENTION=xla "$@"; }; }
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    setup1) python3 -m pip install -q --no-index --no-deps --target /root/site .whl/*.whl
            for w in .whl2 .whl3; do [ -d $w ] && python3 -m pip install -q --no-index --no-deps --target /root/site $w/*.whl; done
            mkdir -p /root/models && cp .model1/part1 /root/models/ ;;
    setup2) cat /root/models/part1 .model2/part2 > "$GGUF" && ls -la "$GGUF" ;;
    faiss)  python3 -m pip install -q --no-index --no-deps --target /root/site .whl2/*.whl ;;
    bench)  python3 benchmarks/sft.py --out "$OUT/sft.json"
            python3 benchmarks/qlora.py ;;
    sampler) python3 benchmarks/sampler.py --gguf "$GGUF" ;;
    sweep)  retry_xla python3 experiments/grpo_arith/sweep.py --model "$GGUF" --out /root/work/sweep ${SWEEP_ARGS:-} ;;
    grpo)   timeout -s TERM ${GRPO_TIMEOUT:-1200} python3 experiments/grpo_arith/run.py --model "$GGUF" --out /root/work/grpo_arith ${GRPO_ARGS:-} ;;
    search_r1) retry_xla python3 experiments/search_r1/run.py --model "$GGUF" --out /root/work/search_r1 ${SR1_ARGS:-} ;;
    luffy)  retry_xla python3 experiments/luffy/run.py --model "$GGUF" --out /root/work/luffy ${LUFFY_ARGS:-} ;;
    agents) python3 experiments/compare.py --config configs/agent_rl.py --out /root/work/agents \
              --method calculator_agent= --seeds 0 1 2 --per-gpu 1 --run-timeout ${RUN_TIMEOUT:-300} \
              --title "Calculator-tool agent trained by RL from its traces, SmolLM2-135M QLoRA" \
              --extra-metrics reward_mean \
              --set model.source=$GGUF num_steps=${STEPS:-40} eval_every=${EVAL_EVERY:-10} model.remat=full model.logits_chunk=32 ;;
    apo)    # APO of the calculator agent's prompt, local SmolLM2 as agent, critic and editor; Agent Lightning's
            # sizes (29 validation tasks, beam 2 x branch 2, 2 rounds); no round starts that would end past
            # 180 s of search; hard stop at 300 s
            timeout -s TERM ${APO_TIMEOUT:-300} python3 experiments/agents/run.py --skip-rl --apo-presets gpu5 \
              --model "$GGUF" --out /root/work/apo ${APO_ARGS:-} ;;
    serve)  python3 -m pip install -q --no-index --no-deps --target /root/site .whl2/*.whl
            python3 benchmarks/serve.py --model "$GGUF" --out "$OUT/serve" --results --rounds ${SERVE_ROUNDS:-1} ;;
    cudnn)  python3 benchmarks/check_cudnn_segments.py --model "$GGUF" --out "$OUT" ;;
    exgrpo) python3 experiments/compare.py --config configs/grpo_arith.py --out /root/work/exgrpo \
              --method grpo= --method exgrpo=exgrpo --seeds 0 1 2 3 --per-gpu ${PER_GPU:-2} \
              --run-timeout ${RUN_TIMEOUT:-420} --title "GRPO vs ExGRPO, SmolLM2-135M QLoRA, 1-2 step arithmetic" \
              --extra-metrics solve_rate reward_mean replay_share buffer_questions buffer_retired \
              --set model.source=$GGUF num_steps=${STEPS:-120} eval_every=${EVAL_EVERY:-20} \
              model.remat=full model.logits_chunk=32 ;;
    masking) python3 experiments/compare.py --config configs/search_r1.py --out /root/work/masking \
              --method masked= --method "unmasked=;search.mask_info=false" --seeds 0 1 2 3 \
              --per-gpu ${PER_GPU:-2} --run-timeout ${RUN_TIMEOUT:-420} --metric eval_em \
              --title "Search-R1 info-token masking ablation, SmolLM2-135M QLoRA" \
              --extra-metrics eval_em_2hop eval_searches reward_mean \
              --set model.source=$GGUF num_steps=${STEPS:-40} eval_every=${EVAL_EVERY:-10} \
              model.remat=full model.logits_chunk=32 ;;
    scaling) python3 benchmarks/scaling.py --out "$OUT/scaling" --results ;;  # 1/2/4 GPUs + 70B-shape fsdp=4
    mp2)    # 2 processes x 1 GPU (jax.distributed on localhost) vs 1 process x 2 GPUs: same losses
            MP="python3 launch.py --config configs/grpo_arith.py:smoke --config.model.source=$GGUF --config.num_steps=3"
            rm -rf /root/work/mp2 && mkdir -p /root/work/mp2
            CUDA_VISIBLE_DEVICES=0,1 $MP --workdir /root/work/mp2/one > /root/work/mp2/one.log 2>&1
            for pid in 0 1; do
              CUDA_VISIBLE_DEVICES=$pid $MP --workdir /root/work/mp2/two --config.distributed.num_processes=2 \
                --config.distributed.coordinator_address=localhost:12355 --config.distributed.process_id=$pid \
                > /root/work/mp2/two-$pid.log 2>&1 &
            done; wait
            python3 -c "import json; h=lambda d: [r.get('loss') for r in json.load(open(f'/root/work/mp2/{d}/history.json'))]; print('1x2 losses', h('one')); print('2x1 losses', h('two'))" | tee "$OUT/mp2.txt" ;;
    pack)   tar czf "$OUT/work.tgz" --exclude=checkpoints --exclude=adapter --exclude=jax_cache --exclude=run \
              -C /root work ;;  # every run's metrics, plots and logs in one file
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  cp benchmarks/RESULTS.md "$OUT/" 2>/dev/null
  if [ -d "/root/work/$stage" ] || [ "$stage" = grpo ]; then
    [ -d "/root/work/$stage/logs" ] && tar czf "$OUT/$stage-logs.tgz" -C "/root/work/$stage" logs
    src=/root/work/$stage; [ "$stage" = grpo ] && src=/root/work/grpo_arith
    mkdir -p "$OUT/$stage" && cp "$src"/*.md "$src"/*.png "$src"/*.json "$OUT/$stage/" 2>/dev/null
  fi
done
nvidia-smi --query-gpu=name,memory.used --format=csv
