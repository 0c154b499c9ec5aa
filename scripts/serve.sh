#!/usr/bin/env bash
# The README's first command: sets up, then starts the OpenAI-compatible server on the built-in
# default model at http://127.0.0.1:8000/v1. Extra arguments go to `python -m server`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m server "$@"
