#!/usr/bin/env bash
# Exit 0 when rank 0 answers /health with 200 (the engine loaded and every rank is alive), else 1
# with the server's reason. For monitoring and `systemctl` ExecStartPost checks.
#   deploy/healthcheck.sh [http://127.0.0.1:8000]
set -u
url="${1:-http://127.0.0.1:${TF_HTTP_PORT:-8000}}"
body=$(curl -s --max-time 5 -w '\n%{http_code}' "$url/health") || { echo "health: no answer from $url"; exit 1; }
code=$(printf '%s' "$body" | tail -n 1)
printf '%s\n' "$(printf '%s' "$body" | head -n -1)"
[ "$code" = "200" ]
