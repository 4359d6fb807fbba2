#!/usr/bin/env bash
# How the GPU numbers in benchmarks/RESULTS.md and experiments/*/RESULTS.md were produced, stage by stage,
# on a machine prepared by ../shared/tools/device-prep.sh (wheels in .whl/, the SmolLM2 GGUF in two halves).
#   bash benchmarks/run_gpu.sh STAGE...   stages: setup1 setup2 runner bench profile unroll nf4 qlora qspeed gemv sampler decode rl apo sweep grpo
#                                          search_r1 luffy
#                                          cudnn exgrpo masking sr1speed sr1impl agents serve serve51 pack
#                                          luffy5 sr1rag combined (issue 16; 4-GPU machine: nvidia-h100-x4)
#                                          scaling mp2 fits distill (multi-GPU machines: nvidia-h100-x2 / -x4)
#                                          psluffy pssr1 (issue 31 paper_scale; 4-GPU machine, one call each)
#                                          rag_student ragserve (issue 34; one GPU)
#                                          tp44 (issue 44, NF4 kernel under TP; nvidia-h200-x2)
#                                          kmajor fused44 (issue 44, the K-major NF4 kernel; one GPU)
#                                          cmdbuf (issue 51, XLA command buffers over the decode loop; one GPU)
#                                          sftfull tunix_grpo (issue 31 peer comparisons; one GPU, one call each)
#                                          par (PAR="runner,serve,..." : one-GPU stages side by side, stage i on
#                                          GPU i of a multi-GPU machine; logs in $OUT/par_STAGE.log)
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
# the peer frameworks' wheels (.whl3: benchmarks/prep_whl3.sh) over .whl, without their dependencies
install_peers() { for w in .whl .whl3; do [ -d $w ] && python3 -m pip install -q --no-index --no-deps --upgrade --target /root/site $w/*.whl; done; }
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    setup1) python3 -m pip install -q --no-index --no-deps --target /root/site .whl/*.whl
            for w in .whl2 .whl3; do [ -d $w ] && python3 -m pip install -q --no-index --no-deps --target /root/site $w/*.whl; done
            mkdir -p /root/models && cp .model1/part1 /root/models/ ;;
    setup2) cat /root/models/part1 .model2/part2 > "$GGUF" && ls -la "$GGUF"  # .whl3 may come with .model2
            [ -d .whl3 ] && python3 -m pip install -q --no-index --no-deps --target /root/site .whl3/*.whl ;;
    faiss)  python3 -m pip install -q --no-index --no-deps --target /root/site .whl2/*.whl ;;
    runner) # issue 32: the benchmark runner (one engine, refilled in waves) vs chunked generate calls,
            # SmolLM2-135M; each path runs twice (the second timed), ~2-3 min on one H200
            timeout -s TERM 420 python3 -m benchmarks.bench_runner --model "$GGUF" --problems 512 --n 4 \
              --max-new-tokens 256 --batch-size 256 --out "$OUT/bench_runner" --write
            cp benchmarks/RESULTS.md "$OUT/" ;;
    bench)  python3 -m benchmarks.sft --out "$OUT/sft.json"   # tokens/s, MFU, peak memory vs transformers+peft
            python3 -m benchmarks.qlora ;;                      # 7B-shape QLoRA peaks, QLoRA vs bf16 speed + MFU
    profile) python3 -m benchmarks.profile_step --out "$OUT/profile"               # 1B bf16 LoRA step by op
             python3 -m benchmarks.profile_step --quant nf4 --out "$OUT/profile" ;;  # same on NF4 weights
    unroll) # issue 17: layer scan vs unrolled layer loop (model.layer_loop), 1B shape, 4 x 1024, one H100, < 8 min
            python3 -m benchmarks.sft --models Llama-3.2-1B --frameworks fineflax --layer-loop both \
              --section sft_unroll --out "$OUT/sft_unroll.json"                      # remat none / full x 2 loops
            python3 -m benchmarks.qlora --only speed --layer-loop both --skip-torch --section qlora_unroll
            cp benchmarks/RESULTS.md "$OUT/"
            python3 -m benchmarks.profile_step --layer-loop unrolled --out "$OUT/profile"   # vs section profile
            python3 -m benchmarks.layer_loop_hlo --quant none --remat none --out "$OUT" --section layer_loop_hlo_gpu
            cp benchmarks/RESULTS.md "$OUT/" ;;
    nf4)    # issue 17 item 3: NF4 dequantisation variants, then 7B QLoRA peaks and 1B QLoRA speed with the old
            # (plain) and new (custom-VJP) NF4 matmul, and a smaller loss-head chunk; one H100, ~10 min
            python3 -m benchmarks.nf4_dequant; cp benchmarks/RESULTS.md "$OUT/"
            python3 -m benchmarks.qlora --only memory --quants nf4 --nf4-matmul plain --section qlora_mem_plain
            cp benchmarks/RESULTS.md "$OUT/"
            python3 -m benchmarks.qlora --only memory --quants nf4 --section qlora_mem_custom; cp benchmarks/RESULTS.md "$OUT/"
            python3 -m benchmarks.qlora --only memory --quants nf4 --logits-chunk 128 --section qlora_mem_custom128
            cp benchmarks/RESULTS.md "$OUT/"
            python3 -m benchmarks.qlora --only speed --skip-torch --nf4-matmul plain --section qlora_speed_plain
            cp benchmarks/RESULTS.md "$OUT/"
            python3 -m benchmarks.qlora --only speed --skip-torch --quants nf4 --section qlora_speed_custom
            cp benchmarks/RESULTS.md "$OUT/" ;;
    qlora)  # issue 17's QLoRA rows: 7B peaks (step and first-call; remat full and offload) with JAX's default
            # allocator, then 1B speed vs bf16 and transformers + peft; ~8 + 4 min, two device calls
            timeout -s TERM 570 python3 -m benchmarks.qlora --only memory --remat full,offload --preallocate
            cp benchmarks/RESULTS.md "$OUT/" ;;
    gemv)   # NF4 products with few rows (decoding): the fused Pallas kernel vs XLA vs bf16, then the 1B decode step
            timeout -s TERM 500 python3 -m benchmarks.nf4_gemv; cp benchmarks/RESULTS.md "$OUT/" ;;
    dense)  # QLoRA decoding from a dense copy of the base (SamplerSession(dense_base=True)) vs NF4 vs bf16
            python3 -m benchmarks.nf4_gemv --decode-only --section nf4_dense_decode; cp benchmarks/RESULTS.md "$OUT/" ;;
    qspeed) python3 -m benchmarks.qlora --only speed --preallocate --section qlora_speed; cp benchmarks/RESULTS.md "$OUT/" ;;
    pdecode) python3 -m benchmarks.profile_decode --out "$OUT" ;;  # SmolLM2 decode step: kernels, busy vs wall
    sampler) python3 -m benchmarks.sampler --gguf "$GGUF" ;;
    decode) python3 -m benchmarks.decode --gguf "$GGUF" --budget ${DECODE_BUDGET:-450} ${DECODE_ARGS:-} ;;  # scan vs unrolled decoder vs transformers, < 8 min
    sweep)  retry_xla python3 -m experiments.grpo_arith.sweep --model "$GGUF" --out /root/work/sweep ${SWEEP_ARGS:-} ;;
    grpo)   timeout -s TERM ${GRPO_TIMEOUT:-1200} python3 -m experiments.grpo_arith.run --model "$GGUF" --out /root/work/grpo_arith ${GRPO_ARGS:-} ;;
    search_r1) retry_xla python3 -m experiments.search_r1.run --model "$GGUF" --out /root/work/search_r1 ${SR1_ARGS:-} ;;
    luffy)  retry_xla python3 -m experiments.luffy.run --model "$GGUF" --out /root/work/luffy ${LUFFY_ARGS:-} ;;
    agents) python3 -m experiments.compare --config configs/agent_rl.py --out /root/work/agents \
              --method calculator_agent= --seeds 0 1 2 --per-gpu 1 --run-timeout ${RUN_TIMEOUT:-300} \
              --title "Calculator-tool agent trained by RL from its traces, SmolLM2-135M QLoRA" \
              --extra-metrics reward_mean \
              --set model.source=$GGUF num_steps=${STEPS:-40} eval_every=${EVAL_EVERY:-10} model.remat=full model.logits_chunk=32 ;;
    apo)    # APO of the calculator agent's prompt, local SmolLM2 as agent, critic and editor; Agent Lightning's
            # sizes (29 validation tasks, beam 2 x branch 2, 2 rounds); no round starts that would end past
            # 330 s of search; hard stop at 560 s (the H100 run took 188 s)
            timeout -s TERM ${APO_TIMEOUT:-560} python3 -m experiments.agents.run --skip-rl --apo-presets gpu5 \
              --model "$GGUF" --out /root/work/apo ${APO_ARGS:-} ;;
    serve)  python3 -m pip install -q --no-index --no-deps --target /root/site .whl2/*.whl
            python3 -m benchmarks.serve --model "$GGUF" --out "$OUT/serve" --results --rounds ${SERVE_ROUNDS:-1} ;;
    tp44)   # issue 44 (nvidia-h200-x2): 70B-shaped decoding over a model axis of 2, NF4 products through the K-major
            # layout's kernel and the bnb-layout kernel on each device's shard (one worker each; XLA's was 12.25x the
            # read), and bf16 linears for the ratio
            timeout -s TERM 560 python3 -m benchmarks.engine --only tp --tp 2 --attention gather \
              --tp-nf4-kernel kmajor,pallas --timeout 270 --write-results
            timeout -s TERM 300 python3 -m benchmarks.engine --only tp --tp 2 --attention gather --tp-quant none \
              --write-results; cp benchmarks/RESULTS.md "$OUT/" ;;
    fused44) # issue 44 (one GPU, two calls back to back: F44=decode, then F44=rollout): the K-major kernel on the
             # fused q|k|v and gate|up products (one product a group) and on longer K spans, 8B shape, then the 8B
             # decode steps reading that table; next call, the 1B products at rollout rows (256) and the QLoRA GRPO
             # step, K-major vs bnb layout (RESULTS.md session_2026_12_08)
             case ${F44:-decode} in
               decode)
                 timeout -s TERM 260 python3 -m benchmarks.nf4_gemv --only products --rows 1,16,64 --budget-s 210 \
                   --variants kmajor,"bf16 W" --shapes "8B q|k|v,8B gate|up,8B q/o,8B down" --out /root/fused44
                 cp /root/fused44/nf4_gemv.md "$OUT/nf4_gemv_8B.md"; cp /root/fused44/nf4_kmajor_table.json "$OUT/table_8B.json"
                 timeout -s TERM 270 python3 -m benchmarks.nf4_gemv --only decode --models 8B --batches 1,16,64 \
                   --weights bf16,nf4-kmajor --out /root/fused44 | tee "$OUT/decode.md" ;;
               rollout)
                 timeout -s TERM 200 python3 -m benchmarks.nf4_gemv --only products --rows 256,64,16,1 --budget-s 150 \
                   --variants kmajor,"bf16 W" --shapes "1B q|k|v,1B gate|up,1B q/o,1B down" --out /root/fused44
                 cp /root/fused44/nf4_gemv.md /root/fused44/nf4_kmajor_table.json "$OUT/"
                 for lay in kmajor bnb; do FINEFLAX_NF4_KMAJOR_TABLE=/root/fused44/nf4_kmajor_table.json \
                   FINEFLAX_NF4_LAYOUT=$lay timeout -s TERM 115 python3 -m benchmarks.rl --models Llama-3.2-1B \
                   --frameworks fineflax --quant nf4 --timeout 105 --out "$OUT/rl_$lay"; done ;;
             esac ;;
    kmajor) # issue 44 (one H200, two calls of ~7 min: KM=products, then KM=steps): the K-major NF4 kernel's
            # variants per product, the 8B rows, then the 1B rows (rollouts: 256) into one fresh
            # nf4_kmajor_table.json under $OUT/kmajor (copy it to fineflax/quant/); the decode steps reading it and
            # the QLoRA GRPO step with the K-major vs the bnb decode layout (RESULTS.md session_2026_11_29b)
            if [ "${KM:-products}" = products ]; then
              timeout -s TERM 210 python3 -m benchmarks.nf4_gemv --only products --rows 1,16,64,8 --shapes 8B \
                --variants kmajor,"bf16 W" --budget-s 180 --out "$OUT/kmajor"
              cp "$OUT/kmajor/nf4_gemv.md" "$OUT/kmajor/nf4_gemv_8B.md"
              timeout -s TERM 165 python3 -m benchmarks.nf4_gemv --only products --rows 1,256,16,64 --shapes 1B \
                --variants kmajor,"bf16 W" --budget-s 135 --out "$OUT/kmajor"
            else
              timeout -s TERM 300 python3 -m benchmarks.nf4_gemv --only decode --models 8B,1B --batches 1,16,64 \
                --weights bf16,nf4-kmajor --out "$OUT/kmajor"
              for lay in kmajor bnb; do FINEFLAX_NF4_LAYOUT=$lay timeout -s TERM 115 python3 -m benchmarks.rl \
                --models Llama-3.2-1B --frameworks fineflax --quant nf4 --timeout 105 --out "$OUT/rl_$lay"; done
            fi ;;
    cmdbuf) # issue 51 (a) / (b): XLA's command buffers over the decode chunk's while loop too (one CUDA graph with
            # conditional nodes a chunk: no host round trip of the loop's predicate and no kernel launches a step)
            # against the default flags; case b (1B long tail, pool 6,144 pages) and case a (8B, room = need);
            # one H200, ~9 min. Case b's note gives the decode call's, the wait's and the host gap's ms a chunk: a call as
            # long as the chunk means its dispatch waits for the while loop (RESULTS session_2026_11_29c)
            CB="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE"
            CB="$CB --xla_gpu_graph_min_graph_size=1"
            for f in "" "$CB"; do
              XLA_FLAGS="$f" timeout -s TERM 200 python3 -m benchmarks.engine --only b --attention paged_decode \
                --admission watermark --pool-pages 6144 --out "$OUT/cmdbuf_b${f:+_while}"
            done
            for f in "" "$CB"; do
              XLA_FLAGS="$f" timeout -s TERM 130 python3 -m benchmarks.engine --only a --attention paged_decode \
                --out "$OUT/cmdbuf_a${f:+_while}"
            done ;;
    serve51) # issue 51 item 4: server tok/s vs the decode ceiling at 1 / 32 / 128 streaming clients and p50 TTFT, on
            # random SmolLM2-135M-shaped bf16 weights with the bundled tokenizer (no GGUF needed); on one H200 the
            # server's warm-up took 162 s (47 programs) and the ceiling did not finish within the next 150 s
            # SERVE_ARGS adds flags, e.g. "--client httpx" (clients without the openai package's own CPU per request);
            # its table splits a decode chunk of the server and of the ceiling into call / wait / host gap ms, and
            # gives the server's CPU ms a chunk per thread; then the HTTP layer alone on this host (benchmarks/serve_http.py);
            # with SERVE_ARGS="--client httpx --rounds 4 --no-warmup" the whole stage took ~130 s (RESULTS session_2026_11_29d)
            # SERVE_ARGS="... --api-procs 0,1,2": one server run per value (0: one process; K: K HTTP front-end processes)
            timeout -s TERM 560 python3 -m benchmarks.serve --random-weights --shared-clients 0 --out "$OUT/serve" \
              --results ${SERVE_ARGS:-}; cp benchmarks/RESULTS.md "$OUT/"
            timeout -s TERM 120 python3 -m benchmarks.serve_http --out "$OUT/serve_http" --results
            cp benchmarks/RESULTS.md "$OUT/" ;;
    rl)     # GRPO step vs TRL and tunix: their wheels (.whl3) over .whl; .whl3/fallback/M only where `import M` fails
            install_peers
            for m in pandas requests; do python3 -c "import $m" 2>/dev/null || \
              python3 -m pip install -q --no-index --no-deps --target /root/site .whl3/fallback/$m/*.whl; done
            timeout -s TERM ${RL_TIMEOUT:-420} python3 -m benchmarks.rl --out "$OUT/rl" ${RL_ARGS:-} ;;
    sftfull) # issue 31: full-parameter SFT at the 1B shape vs transformers full fine-tuning (eager, grad ckpt,
            # torch.compile); section sft_full; one H100 / H200, ~5 min
            timeout -s TERM ${SFT_TIMEOUT:-540} python3 -m benchmarks.sft --params full --models Llama-3.2-1B \
              --torch-compile --out "$OUT/sft_full.json" ;;
    tunix_grpo) # issue 31: full-parameter GRPO step at the Qwen2.5-1.5B shape vs tunix 0.1.7; carry [".whl",
            # ".whl3"] (benchmarks/prep_whl3.sh); section tunix_grpo; one H100 / H200, ~5 min; TG_ARGS e.g.
            # "--variants remat=full remat=none,micro=32 --budget 500" (fineflax cases, then tunix once)
            install_peers
            timeout -s TERM ${TG_TIMEOUT:-540} python3 -m benchmarks.tunix_grpo --out "$OUT/tunix_grpo" ${TG_ARGS:-} ;;
    cudnn)  python3 -m benchmarks.check_cudnn_segments --model "$GGUF" --out "$OUT" ;;
    exgrpo) python3 -m experiments.compare --config configs/grpo_arith.py --out /root/work/exgrpo \
              --method grpo= --method exgrpo=exgrpo --seeds 0 1 2 3 --per-gpu ${PER_GPU:-2} \
              --run-timeout ${RUN_TIMEOUT:-420} --title "GRPO vs ExGRPO, SmolLM2-135M QLoRA, 1-2 step arithmetic" \
              --extra-metrics solve_rate reward_mean replay_share buffer_questions buffer_retired \
              --set model.source=$GGUF num_steps=${STEPS:-120} eval_every=${EVAL_EVERY:-20} \
              model.remat=full model.logits_chunk=32 ;;
    sr1speed) # engine programs in an RL run: Search-R1 masked + unmasked, seed 0, both on GPU 0 (as the issue-35
            # stage runs 2 a GPU), 10 steps with evaluations at 0 and 10; per-step times and XLA compiles
            for arm in masked unmasked; do
              extra=""; [ $arm = unmasked ] && extra="--config.search.mask_info=false"
              JAX_LOG_COMPILES=1 CUDA_VISIBLE_DEVICES=0 timeout -s TERM ${SPEED_TIMEOUT:-300} python3 launch.py \
                --config configs/search_r1.py --workdir /root/work/sr1speed/$arm --config.seed=0 \
                --config.model.source=$GGUF --config.num_steps=10 --config.eval_every=10 \
                --config.model.remat=full --config.model.logits_chunk=32 $extra > "$OUT/sr1speed-$arm.log" 2>&1 &
            done
            wait
            for arm in masked unmasked; do
              echo "== $arm: compiles $(grep -c 'Finished XLA compilation' "$OUT/sr1speed-$arm.log")," \
                "compile s $(grep -o 'Finished XLA compilation of .* in [0-9.]*' "$OUT/sr1speed-$arm.log" | awk '{s+=$NF} END {print s}')"
              python3 -c "import sys; from fineflax.runs import load_history; h, done = load_history(sys.argv[1]); \
print('finished' if done else 'cut', [(r['step'], round(r['time_s'], 1)) for r in h if 'time_s' in r])" \
                /root/work/sr1speed/$arm 2>&1 | tail -1
              grep -o 'Finished XLA compilation of jit([a-z_]*)' "$OUT/sr1speed-$arm.log" | sort | uniq -c | sort -rn | head -8
            done ;;
    sr1impl) # decode impl and compile cost: Search-R1 masked, seed 0, 4 steps (evaluations at 0 and 4), the
            # unrolled and the scan decoder side by side on GPU 0, each with its own empty compilation cache
            for impl in unrolled scan; do
              FINEFLAX_DECODE=$impl JAX_COMPILATION_CACHE_DIR=/root/jax-cache-$impl JAX_LOG_COMPILES=1 \
              CUDA_VISIBLE_DEVICES=0 timeout -s TERM ${SPEED_TIMEOUT:-300} python3 launch.py \
                --config configs/search_r1.py --workdir /root/work/sr1impl/$impl --config.seed=0 \
                --config.model.source=$GGUF --config.num_steps=4 --config.eval_every=4 \
                --config.model.remat=full --config.model.logits_chunk=32 > "$OUT/sr1impl-$impl.log" 2>&1 &
            done
            wait
            for impl in unrolled scan; do
              echo "== $impl:"; grep -o 'Finished XLA compilation of jit([a-z_]*) in [0-9.]*' "$OUT/sr1impl-$impl.log" | \
                awk '{n[$5]++; s[$5]+=$NF} END {for (k in n) if (s[k] > 1) print "  ", k, n[k], "programs", s[k], "s"}'
              grep -o 'eval_em[^,]*\|[0-9]*/4 \[[0-9:]*' "$OUT/sr1impl-$impl.log" | tail -6 | tr '\n' ' '; echo
            done ;;
    masking) python3 -m experiments.compare --config configs/search_r1.py --out /root/work/masking \
              --method masked= --method "unmasked=;search.mask_info=false" --seeds 0 1 2 3 \
              --per-gpu ${PER_GPU:-2} --run-timeout ${RUN_TIMEOUT:-420} --metric eval_em \
              --title "Search-R1 info-token masking ablation, SmolLM2-135M QLoRA" \
              --extra-metrics eval_em_2hop eval_searches reward_mean \
              --set model.source=$GGUF num_steps=${STEPS:-40} eval_every=${EVAL_EVERY:-10} \
              model.remat=full model.logits_chunk=32 ;;
    luffy5) # LUFFY five-way, 5 methods x 4 seeds = 20 runs (3,200 steps). Measured 2026-11-26 with
            # PER_GPU=5 EVAL_EVERY=50 LUFFY_SET="rl.prompts_per_step=16" on one H100: ~1.4 steps/s over the
            # 5 runs, so ~40 min of one H100 (4 calls; ~10 min of 4 x H100). Each call stops every run at the
            # budget with a checkpoint on this machine's disk; the next call on the SAME machine resumes them
            # (a fresh machine starts them over); complete runs return at once; RESULTS.md is rewritten each call
            python3 -m experiments.luffy.run --model "$GGUF" --out /root/work/luffy5 --seeds ${SEEDS:-0 1 2 3} \
              --per-gpu ${PER_GPU:-2} --time-budget ${TIME_BUDGET:-520} --steps ${STEPS:-150} \
              --eval-every ${EVAL_EVERY:-30} --set model.remat=full model.logits_chunk=32 ${LUFFY_SET:-} ;;
    sr1rag) # direct / RAG / oracle-evidence baselines (one child process, ~1-2 min), then Search-R1 RL alone
            # (grpo_only) x 4 seeds, 1 per GPU, 60 steps: ~8-9 min; if stopped, call again (it resumes)
            python3 -m experiments.search_r1.run --model "$GGUF" --out /root/work/sr1rag --methods search_r1 \
              --seeds 0 1 2 3 --per-gpu ${PER_GPU:-1} --time-budget ${TIME_BUDGET:-420} --steps ${STEPS:-60} \
              --eval-every ${EVAL_EVERY:-15} --set model.remat=full model.logits_chunk=32 ;;
    combined) # the combined mode (Search-R1 + LUFFY oracle traces) x 4 seeds next to sr1rag's runs (same
            # folder: those return at once, baselines are cached): ~8-9 min; if stopped, call again
            python3 -m experiments.search_r1.run --model "$GGUF" --out /root/work/sr1rag \
              --methods search_r1 combined --seeds 0 1 2 3 --per-gpu ${PER_GPU:-2} \
              --time-budget ${TIME_BUDGET:-500} --steps ${STEPS:-60} --eval-every ${EVAL_EVERY:-15} \
              --set model.remat=full model.logits_chunk=32
            mkdir -p "$OUT/combined" && cp /root/work/sr1rag/*.md /root/work/sr1rag/*.png /root/work/sr1rag/*.json \
              "$OUT/combined/" && tar czf "$OUT/combined-logs.tgz" -C /root/work/sr1rag logs ;;
    finish16) # issue 16's last runs + issue 17's unroll stage on one 4-GPU machine (nvidia-h100-x4), one call
            # of < 10 min; the same call again on the SAME machine resumes what the budget stopped. Defaults:
            # GPU 0 the unroll stage, GPUs 1-2 the LUFFY five-way's seed 3 (4 runs, settings of luffy5's
            # seeds 0-2), GPU 3 Search-R1 alone x 4 seeds (40 steps, as the masking ablation whose masked
            # arm is the combined mode). Run folders (no checkpoints) come back as tarballs.
            mkdir -p /root/work/sr1rag && cp -n experiments/search_r1/baselines.json /root/work/sr1rag/
            [ -n "${F16_UNROLL_GPU-0}" ] && { CUDA_VISIBLE_DEVICES=${F16_UNROLL_GPU-0} timeout -s TERM 560 \
              bash benchmarks/run_gpu.sh unroll > "$OUT/unroll.log" 2>&1 & }
            CUDA_VISIBLE_DEVICES=${F16_LUFFY_GPUS:-1,2} python3 -m experiments.luffy.run --model "$GGUF" \
              --out /root/work/luffy5 --seeds 3 --methods rl sft_rl luffy luffy_noshape --per-gpu 2 \
              --time-budget ${TIME_BUDGET:-470} --steps 150 --eval-every 50 \
              --set model.remat=full model.logits_chunk=32 rl.prompts_per_step=16 > "$OUT/luffy3.log" 2>&1 &
            CUDA_VISIBLE_DEVICES=${F16_SR1_GPUS:-3} python3 -m experiments.search_r1.run --model "$GGUF" \
              --out /root/work/sr1rag --methods search_r1 --seeds 0 1 2 3 --per-gpu ${F16_SR1_PER_GPU:-4} \
              --time-budget ${TIME_BUDGET:-470} --steps 40 --eval-every 10 \
              --set model.remat=full model.logits_chunk=32 > "$OUT/sr1.log" 2>&1 &
            wait
            for d in luffy5 sr1rag; do tar czf "$OUT/$d-runs.tgz" -C /root/work --exclude=checkpoints --exclude=adapter $d; done ;;
    scaling) python3 -m benchmarks.scaling --out "$OUT/scaling" --results ;;  # 1/2/4 GPUs + 70B-shape fsdp=4
    mp2)    # 2 processes x 1 GPU (jax.distributed on localhost) vs 1 process x 2 GPUs: same losses
            MP="python3 launch.py --config configs/grpo_arith.py:smoke --config.model.source=$GGUF --config.num_steps=4 --config.rl.prompts_per_step=16 --config.rl.group_size=8 --config.rl.max_new_tokens=96 --config.task.num_eval=32"
            rm -rf /root/work/mp2 && mkdir -p /root/work/mp2
            CUDA_VISIBLE_DEVICES=0,1 $MP --workdir /root/work/mp2/one > /root/work/mp2/one.log 2>&1
            for pid in 0 1; do
              CUDA_VISIBLE_DEVICES=$pid $MP --workdir /root/work/mp2/two --config.distributed.num_processes=2 \
                --config.distributed.coordinator_address=localhost:12355 --config.distributed.process_id=$pid \
                > /root/work/mp2/two-$pid.log 2>&1 &
            done; wait
            python3 -c "import json; h=lambda d, k: [round(r[k], 4) for r in json.load(open(f'/root/work/mp2/{d}/history.json')) if k in r]
for k in ('loss', 'grad_norm', 'reward_mean', 'time_rollout_s', 'time_update_s'): print(k, '1x2:', h('one', k), '2x1:', h('two', k))" | tee "$OUT/mp2.txt"
            tail -n 3 /root/work/mp2/*.log ;;
    distill) # teacher = NF4 base + a GRPO adapter trained here; student = a fresh rank-4 LoRA (experiments/distill)
            D=/root/work/distill; mkdir -p $D; M="--config.model.source=$GGUF --config.model.remat=full --config.model.logits_chunk=32"
            python3 launch.py --config configs/grpo_arith.py $M --config.num_steps=${GRPO_STEPS:-100} \
              --config.eval_every=${GRPO_STEPS:-100} --workdir $D/teacher_grpo > $D/teacher.log 2>&1; tail -n 2 $D/teacher.log
            for v in ${DISTILL_VARIANTS:-full top20}; do
              extra=""; [ $v = top20 ] && extra="--config.distill.top_k=20"
              python3 launch.py --config configs/distill.py $M --config.teacher.adapter=$D/teacher_grpo/adapter \
                --config.num_steps=${DISTILL_STEPS:-60} --config.eval_every=${DISTILL_STEPS:-60} $extra \
                --workdir $D/student_$v > $D/student_$v.log 2>&1; tail -n 2 $D/student_$v.log
            done
            cp $D/*.log "$OUT/" ; for d in $D/*/; do cp $d/summary.json "$OUT/$(basename $d)_summary.json"; done ;;
    fits)   python3 -m benchmarks.scaling --out "$OUT/scaling" --only none --fits_fsdp ${FITS_FSDP:-2} ;;
    psluffy) # issue 31 target 1: full-parameter LUFFY step, Qwen2.5-Math-7B shape, all visible GPUs (one call)
            python3 -m benchmarks.paper_scale --recipe luffy --out "${PS_OUT:-benchmarks/out/paper_scale}" --results
            cp -r "${PS_OUT:-benchmarks/out/paper_scale}" "$OUT/"; cp benchmarks/RESULTS.md "$OUT/" ;;
    pssr1)  # issue 31 target 2: Search-R1 PPO step (full critic), Qwen2.5-7B shape; keeps psluffy's row
            python3 -m benchmarks.paper_scale --recipe search_r1_ppo --out "${PS_OUT:-benchmarks/out/paper_scale}" --results
            cp -r "${PS_OUT:-benchmarks/out/paper_scale}" "$OUT/"; cp benchmarks/RESULTS.md "$OUT/" ;;
    ragserve) # issue 34 latency target: naive RAG vs the bare model at 16 clients (bm25: the GPU machine has no
            # faiss / all-MiniLM-L6-v2; the vector retriever is the CPU default), ~2-3 min
            timeout -s TERM 400 python3 -m benchmarks.rag_serve --model "$GGUF" --retriever bm25 \
              --out "$OUT/rag_serve" --results; cp benchmarks/RESULTS.md "$OUT/" ;;
    rag_student) # issue 34: the RAG loop's student, one H200/H100 call of ~6 min: QLoRA SFT of SmolLM2-135M on the
            # logged rows with / without context (2 x 300 steps), both answer the 90 held-out questions
            # (work/heldout_prompts.jsonl: no embedder needed), then the student as a new routed arm (CPU, ~1 min)
            timeout -s TERM ${RAG_STUDENT_TIMEOUT:-570} python3 -m experiments.rag_loop.student --model "$GGUF" \
              --out /root/work/rag_student ${RAG_STUDENT_ARGS:-}
            mkdir -p "$OUT/rag_student"
            cp /root/work/rag_student/*.{md,json,png,log} "$OUT/rag_student/" 2>/dev/null; ls "$OUT/rag_student" ;;
    pack)   tar czf "$OUT/work.tgz" --exclude=checkpoints --exclude=adapter --exclude=jax_cache --exclude=run \
              -C /root work ;;  # every run's metrics, plots and logs in one file
    par)    # one-GPU stages at once, each alone on its own GPU (a multi-GPU machine's time counts in full)
            i=0; pids=()
            for s in ${PAR//,/ }; do
              CUDA_VISIBLE_DEVICES=$i OUT="$OUT" bash "$0" "$s" > "$OUT/par_$s.log" 2>&1 & pids+=($!); i=$((i + 1))
            done
            for p in "${pids[@]}"; do wait "$p"; done; tail -n 5 "$OUT"/par_*.log ;;
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
