#!/usr/bin/env bash
# The second wheel folder (.whl2/) of a GPU run, beside ../shared/tools/device-prep.sh's .whl/: what the
# server, the serving benchmarks and the BM25 retrieval need but the GPU machine lacks (starlette, uvicorn
# with httptools, the openai client and its httpx2 stack, PyStemmer for bm25s). Run from the project root;
# `bash benchmarks/run_gpu.sh setup1` installs it when carried (carry [".whl", ".whl2", ".model1"]).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qxF "/.whl2/" .git/info/exclude 2>/dev/null || echo "/.whl2/" >> .git/info/exclude
rm -rf .whl2 && mkdir -p .whl2
for p in starlette uvicorn httptools openai httpx2 httpcore2 truststore jiter h11 pydantic pydantic_core \
         annotated-types annotated-doc typing-inspection anyio sniffio distro PyStemmer; do
  v=$(python3 -m pip show "$p" 2>/dev/null | sed -n "s/^Version: //p" || true)  # this machine's version, if installed
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl2 "$p${v:+==$v}" 2>/dev/null
done
# a wheel that .whl/ (device-prep.sh) already holds is dropped: pip refuses one install command given the same
# wheel twice ("conflicting dependencies"), and installs nothing
[ -d .whl ] && for w in .whl2/*.whl; do [ -e ".whl/$(basename "$w")" ] && rm -f "$w"; done
du -sh .whl2
