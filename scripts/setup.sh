#!/usr/bin/env bash
# Creates .venv with the pinned requirements and the trellisforge package, then builds the library.
# Builds the CUDA kernels too when nvcc is on PATH (set TF_NVCC= to skip, or to an nvcc path).
# Each step says what it does before it starts and how long it took; a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { # step NAME FIRST-TIME-ESTIMATE COMMAND...
  local name=$1 estimate=$2 started=$SECONDS
  shift 2
  echo "setup: $name ... (first time: $estimate)"
  "$@"
  echo "setup: $name: done in $((SECONDS - started)) s"
}
pip_quiet() { .venv/bin/pip install -q --disable-pip-version-check "$@"; }

step "python environment (.venv)" "seconds" python3 -m venv .venv
step "pinned packages (pip: zig, numpy, tokenizers, fastapi, llguidance, ...)" "about a minute" pip_quiet -r requirements.txt
step "trellisforge package (editable install of python/)" "seconds" pip_quiet --no-deps -e python
nvcc_path="${TF_NVCC-$(command -v nvcc || true)}"
if [ -n "$nvcc_path" ]; then
  step "library and CUDA kernels (zig build -Dnvcc=$nvcc_path)" "5 to 10 minutes on 2 cores; then seconds" \
    .venv/bin/python -m ziglang build -Dnvcc="$nvcc_path"
else
  step "library (zig build; no nvcc, so the CUDA backend will say it is unavailable)" "about a minute" \
    .venv/bin/python -m ziglang build
fi
