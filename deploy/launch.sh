#!/usr/bin/env bash
# Starts this node's rank of the two-node TP=2 deployment after checking what usually goes wrong:
# the environment file, the model directory, the link to the other node, and NCCL's settings.
#   deploy/launch.sh [--check] [--rank N] [ENV_FILE]   (default /etc/trellisforge/trellisforge.env)
# --check only runs the checks; --rank overrides TF_RANK from the file (the systemd units use it).
set -euo pipefail
check_only=0
rank_override=""
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check_only=1; shift ;;
    --rank) rank_override="$2"; shift 2 ;;
    *) break ;;
  esac
done
env_file="${1:-/etc/trellisforge/trellisforge.env}"
[ -r "$env_file" ] || { echo "launch: cannot read $env_file" >&2; exit 2; }
set -a; . "$env_file"; set +a
[ -n "$rank_override" ] && TF_RANK="$rank_override"

fail() { echo "launch: $*" >&2; exit 2; }
note() { echo "launch: $*"; }

for var in TF_RANK TF_WORLD TF_MODEL_DIR TF_MASTER_ADDR TF_MASTER_PORT TF_HOME; do
  [ -n "${!var:-}" ] || fail "$var is not set in $env_file"
done
[ "$TF_RANK" -ge 0 ] && [ "$TF_RANK" -lt "$TF_WORLD" ] || fail "TF_RANK $TF_RANK is outside 0..$((TF_WORLD - 1))"
[ -f "$TF_MODEL_DIR/config.json" ] || fail "$TF_MODEL_DIR has no config.json (the checkpoint must be on both nodes)"
[ -x "$TF_HOME/.venv/bin/python" ] || fail "$TF_HOME/.venv is missing: run $TF_HOME/scripts/setup.sh"
[ "${NCCL_NVLS_ENABLE:-}" = "0" ] || fail "NCCL_NVLS_ENABLE must be 0"

if [ -n "${NCCL_SOCKET_IFNAME:-}" ]; then
  ip link show "$NCCL_SOCKET_IFNAME" >/dev/null 2>&1 || fail "NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME is not an interface here (ip -br link)"
  state=$(cat "/sys/class/net/$NCCL_SOCKET_IFNAME/operstate" 2>/dev/null || echo unknown)
  [ "$state" = "up" ] || fail "$NCCL_SOCKET_IFNAME is $state, not up: check the ConnectX-7 cable"
fi
if [ -n "${NCCL_IB_HCA:-}" ] && [ -d /sys/class/infiniband ]; then
  for hca in ${NCCL_IB_HCA//,/ }; do
    [ -d "/sys/class/infiniband/${hca%%:*}" ] || fail "NCCL_IB_HCA names ${hca%%:*}, which /sys/class/infiniband lacks (ibv_devices)"
  done
fi
if [ "$TF_RANK" -ne 0 ]; then
  ping -c 1 -W 2 "$TF_MASTER_ADDR" >/dev/null 2>&1 || fail "rank 0 at $TF_MASTER_ADDR does not answer ping over the link"
fi
"$TF_HOME/.venv/bin/python" -c "import trellisforge, sys; ok, why = trellisforge.cuda_available(); sys.exit(0 if ok or '$TF_BACKEND' != 'cuda' else print(why) or 1)" \
  || fail "the CUDA backend is not usable on this node"
note "checks passed: rank $TF_RANK of $TF_WORLD, model $TF_MODEL_DIR, master $TF_MASTER_ADDR:$TF_MASTER_PORT"
[ "$check_only" -eq 1 ] && exit 0

cd "$TF_HOME"
common=(--model "$TF_MODEL_DIR" --backend "${TF_BACKEND:-cuda}" --tp-world "$TF_WORLD" --tp-rank "$TF_RANK"
        --tp-master "$TF_MASTER_ADDR:$TF_MASTER_PORT" --max-seqs "${TF_MAX_SEQS:-16}" --ctx "${TF_CTX:-0}")
if [ "$TF_RANK" -eq 0 ]; then
  exec .venv/bin/python -m server "${common[@]}" --host "${TF_HTTP_HOST:-0.0.0.0}" --port "${TF_HTTP_PORT:-8000}" \
    --model-name "${TF_MODEL_NAME:-$(basename "$TF_MODEL_DIR")}" --kv-dtype "${TF_KV_DTYPE:-f16}" --kv-tokens "${TF_KV_TOKENS:-0}"
else
  exec .venv/bin/python -m server "${common[@]}"
fi
