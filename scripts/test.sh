#!/usr/bin/env bash
# Every test: the Zig host tests (native, and aarch64 under qemu when qemu-aarch64 is there, as on
# the DGX Spark's ARM64 host), then pytest. GPU checks skip here with their reason; they run on a
# GPU machine through zig-out/bin/tf-cuda-test.
set -euo pipefail
cd "$(dirname "$0")/.."
zig() { .venv/bin/python -m ziglang "$@"; }
zig build test --summary all
if command -v qemu-aarch64 >/dev/null && [ -d /usr/aarch64-linux-gnu ]; then
  zig build test -Dtarget=aarch64-linux-gnu -fqemu --libc-runtimes /usr --summary all
else
  echo "SKIP aarch64 host tests: qemu-user and libc6-arm64-cross are not installed"
fi
# The kernel contract runs inside pytest (tests/test_kernel_contract.py) when nvcc is on PATH.
.venv/bin/python -m pytest tests -q -rs
