#!/usr/bin/env bash
# The third wheel folder (.whl3/) of a GPU run: the peer frameworks of the GRPO benchmarks that the GPU
# machine lacks (it has jax, flax, optax, orbax, transformers, torch, peft). tunix 0.1.7 (+ qwix and what
# `tunix.rl.grpo` imports: jaxtyping, wadler-lindig, google-metrax, perfetto, sentencepiece) for
# benchmarks/tunix_grpo.py and benchmarks/rl.py; TRL for benchmarks/rl.py, with pandas and requests in
# .whl3/fallback/ (installed only where `import` fails). Installed with --no-deps, so jax / flax stay as
# they are (checked here: `pip install --dry-run google-tunix==0.1.7` beside jax 0.10.2 / flax 0.12.8
# changes neither). Run from the project root; carry [".whl", ".whl3"]; `bash benchmarks/run_gpu.sh
# setup1` or the stages rl / tunix_grpo install it. Prints the folder's size (about 20 MB).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .whl3 && mkdir -p .whl3/fallback/pandas .whl3/fallback/requests
get() {  # get DIR SPEC: one wheel for the GPU machine's CPython 3.12 on x86-64
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$1" "$2"
}
for p in google-tunix==0.1.7 qwix==0.1.8 jaxtyping wadler-lindig google-metrax perfetto sentencepiece trl; do
  get .whl3 "$p"
done
get .whl3/fallback/pandas pandas
get .whl3/fallback/requests requests
du -sh .whl3
