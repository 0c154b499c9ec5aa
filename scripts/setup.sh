#!/usr/bin/env bash
# Creates .venv with the pinned requirements and the trellisforge package, then builds the library.
# Builds the CUDA kernels too when nvcc is on PATH (set TF_NVCC= to skip, or to an nvcc path).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e python
nvcc_path="${TF_NVCC-$(command -v nvcc || true)}"
if [ -n "$nvcc_path" ]; then
  .venv/bin/python -m ziglang build -Dnvcc="$nvcc_path"
else
  .venv/bin/python -m ziglang build
fi
