#!/usr/bin/env bash
# The README's first command: sets up, then starts the server on the built-in default model. Until
# the OpenAI server lands it runs the Python API demo instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m trellisforge.demo "$@"
