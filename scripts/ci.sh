#!/usr/bin/env bash
# The README's test command: installs what the tests need on a fresh Debian machine (qemu-user and
# the arm64 C library for the aarch64 host tests), sets up, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v qemu-aarch64 >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user libc6-arm64-cross >/dev/null) \
    || echo "note: could not install qemu-user/libc6-arm64-cross; aarch64 tests will skip"
fi
bash scripts/setup.sh
bash scripts/test.sh
