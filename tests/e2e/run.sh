#!/usr/bin/env bash
# End-to-end tests: real clusters on loopback (`moeshard up`, ports chosen at run time),
# each checked by the integration suite (tests/itest, the binary BUILD_DIR/tests/moeshard-itest)
# and, in some configurations, by the official openai npm package and a grpc-js client
# (tests/clients). Builds nothing.
#
#   tests/e2e/run.sh BUILD_DIR
#
# Environment: MOESHARD_TESTDATA (default BUILD_DIR/testdata, which the build assembles from
# tests/testdata; a missing model is a failure),
# MOESHARD_E2E_NODE=0 to leave out the node clients, MOESHARD_E2E_KEEP=1 to keep the logs,
# MOESHARD_E2E_UP_ARGS for extra `moeshard up` flags in every configuration,
# MOESHARD_E2E_ITEST_ARGS for extra `moeshard-itest` flags (the GPU lane's bf16 run passes
# `--tolerance bf16`), MOESHARD_E2E_ONLY="NAME ..." to run only those configurations (each one
# left out is printed and counted as skipped).
# Prints one line per check and a last line `N passed, M failed, K skipped` (each skip is listed
# above it); exits 1 on any failure.
set -uo pipefail

if [[ $# -ne 1 || ! -d $1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "$1" && pwd)
TESTDATA=${MOESHARD_TESTDATA:-$BUILD/testdata}
MOESHARD=""
for c in "$BUILD/moeshard" "$BUILD/cli/moeshard"; do
  [[ -x $c ]] && { MOESHARD=$c; break; }
done
if [[ -z $MOESHARD ]]; then
  echo "e2e: no moeshard binary in $BUILD (build it first)" >&2
  exit 1
fi
ITEST=$BUILD/tests/moeshard-itest
[[ -x $ITEST ]] || ITEST=$BUILD/moeshard-itest  # a flat bundle (the GPU lane's)
if [[ ! -x $ITEST ]]; then
  echo "e2e: no $ITEST (build it first: the integration suite, tests/itest)" >&2
  exit 1
fi
for m in muse-spark-tiny muse-spark-tiny-nvfp4 muse-spark-kv4 qwen3moe-tiny qwen3moe-tok; do
  if [[ ! -f $TESTDATA/$m/config.json ]]; then
    echo "e2e: no test model $TESTDATA/$m (the build assembles them; set MOESHARD_TESTDATA)" >&2
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
  fi
done

WORK=$(mktemp -d /tmp/moeshard-e2e.XXXXXX)
# The cluster credential of every cluster here (`moeshard up` takes it from the environment):
# the itest's scrapes of coordinators' and workers' /metrics need it.
MOESHARD_CLUSTER_TOKEN=${MOESHARD_CLUSTER_TOKEN:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export MOESHARD_CLUSTER_TOKEN
PASSED=0
FAILED=0
SKIPPED=0
UP_PID=""
ITEST_POOLS=""  # --pools of moeshard-itest for the next run_config (a cluster of length pools)

stop_cluster() {
  [[ -z $UP_PID ]] && return
  # `moeshard up` stops its children on SIGTERM; its process group is the safety net.
  kill -TERM "$UP_PID" 2>/dev/null
  for _ in $(seq 100); do
    kill -0 "$UP_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$UP_PID" 2>/dev/null
  wait "$UP_PID" 2>/dev/null
  UP_PID=""
}

finish() {
  stop_cluster
  if [[ ${MOESHARD_E2E_KEEP:-0} == 1 || $FAILED -ne 0 ]]; then
    echo "e2e: logs in $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap finish EXIT
trap 'exit 130' INT TERM

pass() { PASSED=$((PASSED + 1)); echo "ok  $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1"; }
skip() { SKIPPED=$((SKIPPED + 1)); echo "skip $1"; }

# Adds the `N passed, M failed, K skipped` line of a log to the totals (a log without one is a
# failure).
count_summary() {
  local log=$1 name=$2 line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -1)
  if [[ -z $line ]]; then
    fail "$name: no summary line (crashed?); see $log"
    return
  fi
  PASSED=$((PASSED + $(awk '{print $1}' <<<"$line")))
  FAILED=$((FAILED + $(awk '{print $3}' <<<"$line")))
  SKIPPED=$((SKIPPED + $(awk '{print $5}' <<<"$line")))
}

# start_cluster NAME UP_ARGS...: starts `moeshard up` in its own process group and waits
# for "ready"; sets URL, GRPC and METRICS (comma-separated).
start_cluster() {
  local name=$1
  shift
  local out=$WORK/$name.up.out err=$WORK/$name.up.err
  setsid "$MOESHARD" up "$@" >"$out" 2>"$err" &
  UP_PID=$!
  for _ in $(seq 1200); do
    grep -q '^moeshard up: ready' "$out" && break
    if ! kill -0 "$UP_PID" 2>/dev/null; then
      wait "$UP_PID" 2>/dev/null
      UP_PID=""
      break
    fi
    sleep 0.1
  done
  if ! grep -q '^moeshard up: ready' "$out"; then
    fail "$name: moeshard up $* did not become ready"
    tail -n 20 "$err" | sed 's/^/    /'
    stop_cluster
    return 1
  fi
  URL=$(sed -n 's/^moeshard up: \(http[^ ]*\) grpc \(.*\)$/\1/p' "$out" | head -1)
  GRPC=$(sed -n 's/^moeshard up: \(http[^ ]*\) grpc \(.*\)$/\2/p' "$out" | head -1)
  METRICS=$(sed -n 's/^moeshard up: metrics //p' "$out" | head -1 | tr ' ' ',')
  return 0
}

NODE_READY=""
node_clients_ready() {
  [[ -n $NODE_READY ]] && { [[ $NODE_READY == yes ]]; return; }
  NODE_READY=no
  if [[ ${MOESHARD_E2E_NODE:-1} == 0 ]]; then
    SKIPPED=$((SKIPPED + 1))
    echo "skip node clients: MOESHARD_E2E_NODE=0"
  elif ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    SKIPPED=$((SKIPPED + 1))
    echo "skip node clients: node/npm not installed"
  elif [[ -d $ROOT/tests/clients/node_modules ]] || (cd "$ROOT/tests/clients" && npm ci --no-audit --no-fund >"$WORK/npm-ci.log" 2>&1); then
    NODE_READY=yes
  else
    fail "node clients: npm ci failed; see $WORK/npm-ci.log"
  fi
  [[ $NODE_READY == yes ]]
}

# run_config NAME MODEL_DIR KEY NODE UP_ARGS...: one cluster, the suite, maybe the clients.
run_config() {
  local name=$1 model=$2 key=$3 node=$4
  shift 4
  local t0=$SECONDS args=(--model "$model" "$@")
  if [[ -n ${MOESHARD_E2E_ONLY:-} && " $MOESHARD_E2E_ONLY " != *" $name "* ]]; then
    skip "$name: not in MOESHARD_E2E_ONLY"
    return
  fi
  # shellcheck disable=SC2206
  args+=(${MOESHARD_E2E_UP_ARGS:-})
  [[ -n $key ]] && args+=(--api-key "$key")
  echo "== $name: moeshard up ${args[*]}"
  start_cluster "$name" "${args[@]}" || return
  local itest=(--url "$URL" --model "$model")
  [[ -n $GRPC ]] && itest+=(--grpc "$GRPC")
  [[ -n $METRICS ]] && itest+=(--metrics "$METRICS")
  [[ -f $model/goldens.safetensors ]] && itest+=(--goldens "$model/goldens.safetensors")
  [[ -n $key ]] && itest+=(--api-key "$key")
  [[ -n $ITEST_POOLS ]] && itest+=(--pools "$ITEST_POOLS")
  # shellcheck disable=SC2206
  itest+=(${MOESHARD_E2E_ITEST_ARGS:-})
  "$ITEST" "${itest[@]}" 2>&1 | tee "$WORK/$name.itest.log" | grep -v '^[0-9]* passed, [0-9]* failed, [0-9]* skipped$' | sed 's/^/  /'
  count_summary "$WORK/$name.itest.log" "$name itest"
  if [[ $node == node ]] && node_clients_ready; then
    (cd "$ROOT/tests/clients" &&
      MOESHARD_URL=$URL MOESHARD_GRPC=$GRPC MOESHARD_API_KEY=$key MOESHARD_GOLDENS=$model/goldens.safetensors \
        node --test --test-reporter=tap --test-concurrency=1 openai.test.mjs grpc.test.mjs) >"$WORK/$name.node.log" 2>&1
    local np nf ns
    np=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$WORK/$name.node.log" | tail -1)
    nf=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$WORK/$name.node.log" | tail -1)
    ns=$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' "$WORK/$name.node.log" | tail -1)
    if [[ -z $np || -z $nf || -z $ns ]]; then
      fail "$name node clients: no summary; see $WORK/$name.node.log"
    else
      PASSED=$((PASSED + np))
      FAILED=$((FAILED + nf))
      SKIPPED=$((SKIPPED + ns))
      echo "  node clients (openai, grpc-js): $np passed, $nf failed, $ns skipped"
      [[ $nf -ne 0 ]] && grep -E '^not ok|^ *(error|expected|actual):' "$WORK/$name.node.log" | head -20 | sed 's/^/    /'
    fi
  fi
  if [[ $name == muse-1w ]]; then
    if "$MOESHARD" bench serve --url "$URL" --concurrency 4 --requests 8 --prompt-len 32 --output-len 8 --stream \
      >"$WORK/bench.log" 2>&1; then
      pass "$name: moeshard bench serve runs"
    else
      fail "$name: moeshard bench serve failed; see $WORK/bench.log"
    fi
  fi
  stop_cluster
  echo "   ($name: $((SECONDS - t0)) s)"
}

# check_refused NAME MODEL MESSAGE UP_ARGS...: `moeshard up` refuses the plan before starting
# anything, exits non-zero, and its output holds MESSAGE (a fixed string: the plan's own error).
check_refused() {
  local name=$1 model=$2 want=$3
  shift 3
  if [[ -n ${MOESHARD_E2E_ONLY:-} && " $MOESHARD_E2E_ONLY " != *" $name "* ]]; then
    skip "$name: not in MOESHARD_E2E_ONLY"
    return
  fi
  local out=$WORK/$name.out
  setsid timeout 120 "$MOESHARD" up --model "$model" "$@" >"$out" 2>&1 &
  UP_PID=$!
  wait "$UP_PID"
  local rc=$?
  UP_PID=""
  if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -qF -- "$want" "$out" && ! grep -q '^moeshard up: ready' "$out"; then
    pass "$name: refused with '$want'"
  else
    fail "$name: want a refusal saying '$want', got exit $rc: $(tail -n 3 "$out" | tr '\n' ' ')"
  fi
}

T0=$SECONDS
MUSE=$TESTDATA/muse-spark-tiny
QWEN=$TESTDATA/qwen3moe-tiny
NVFP4=$TESTDATA/muse-spark-tiny-nvfp4
TOK=$TESTDATA/qwen3moe-tok
KEY=e2e-$RANDOM$RANDOM

run_config muse-1w "$MUSE" "" - --workers 1
run_config muse-ls2 "$MUSE" "" - --workers 2 --mode layer-split --max-model-len 2048
run_config muse-ls3-uneven "$MUSE" "" - --workers 3 --mode layer-split --layer-split 2,1,1
# vLLM-style names exported directly (moeshard:<name>): the suite reads either prefix.
run_config muse-tp2 "$MUSE" "" - --workers 2 --mode tensor-parallel --metric-prefix moeshard:
run_config qwen-ls3-uneven "$QWEN" "$KEY" - --workers 3 --mode layer-split --layer-split 2,1,1
run_config qwen-tp2 "$QWEN" "" - --workers 2 --mode tensor-parallel
run_config nvfp4-ls2 "$NVFP4" "" - --workers 2 --mode layer-split
# The tokenizer model: text prompts and chat, the node clients, an API key, both modes.
# --max-model-len: the context-limit check prefills a prompt of nearly that length (and so does the
# in-process reference, which holds up to 4160 positions); kept short where a cluster is slow.
run_config tok-ls2 "$TOK" "$KEY" node --workers 2 --mode layer-split --max-model-len 2048
run_config tok-tp2 "$TOK" "$KEY" node --workers 2 --mode tensor-parallel --max-model-len 2048
# The bundled demo model (trained: real text, its own tokenizer and EOS), as `make run` serves it.
run_config demo-tp2 "$ROOT/models/muse-spark-demo" "$KEY" - --workers 2 --mode tensor-parallel --max-model-len 2048
# Tensor parallel over 4: muse-spark-kv4 has 4 KV heads (the others 2) and goldens from the reference.
run_config muse-kv4-tp4 "$TESTDATA/muse-spark-kv4" "" - --workers 4 --mode tensor-parallel --max-model-len 2048
# Length pools on one machine: a short (512) and a long (2048) pool of one CPU worker each. The
# suite's pools group (tests/itest/checks_pools.cc) proves from the router's per-pool counters
# and each coordinator's own /metrics that a request goes to the smallest pool that holds
# prompt + max_tokens, that one no pool holds is a 400 naming the 2048-token limit, and that
# each pool runs with its own KV settings (num_kv_blocks: its coordinator's kv_blocks gauge;
# kv_dtype reaches its worker, which refuses what the CPU backend does not keep).
cat >"$WORK/pools.json" <<'JSON'
{"pools": [{"name": "short", "max_model_len": 512, "workers": 1, "num_kv_blocks": 600},
           {"name": "long", "max_model_len": 2048, "workers": 1, "num_kv_blocks": 1000, "kv_dtype": "float32"}]}
JSON
ITEST_POOLS=short:512:kvblocks=600,long:2048:kvblocks=1000
run_config muse-pools "$MUSE" "" - --pools "$WORK/pools.json"
ITEST_POOLS=""
# A pools file with a typo stops `up` before any process starts, naming the pool and the key; a
# pool whose KV type the CPU backend does not keep stops it with the worker's reason.
printf '{"pools": [{"name": "short", "max_model_len": 512, "kv-dtype": "fp8"}]}' >"$WORK/pools-typo.json"
check_refused muse-pools-typo "$MUSE" 'pools config: pool short: unknown key "kv-dtype"' --pools "$WORK/pools-typo.json"
printf '{"pools": [{"name": "short", "max_model_len": 512}, {"name": "long", "kv_dtype": "fp8"}]}' >"$WORK/pools-fp8.json"
check_refused muse-pools-cpu-fp8 "$MUSE" "the CPU backend keeps its KV cache in float32" --pools "$WORK/pools-fp8.json"
check_refused muse-tp4-refused "$MUSE" \
  "tensor parallel over 4 workers does not fit this model" --workers 4 --mode tensor-parallel
check_refused muse-tp4-refused-sizes "$MUSE" \
  "worker counts that work: 1, 2 (they divide 2 KV heads, 16 experts" --workers 4 --mode tensor-parallel

echo "e2e: $((SECONDS - T0)) s"
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
[[ $FAILED -eq 0 ]]
