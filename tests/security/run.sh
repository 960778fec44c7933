#!/usr/bin/env bash
# The attacks of issue 15 against a live cluster: `moeshard up` on the tokenizer test model
# (two workers, an API key from the environment, internal services on 127.0.0.2), then
# attacks.test.mjs (grpc-js and raw sockets, from another process). Checks here: the
# internal ports listen on the internal address only, the cluster survives the suite.
# Builds nothing. Prints one line per check and `N passed, M failed`; exits 1 on a failure.
#
#   tests/security/run.sh BUILD_DIR
set -uo pipefail
if [[ $# -ne 1 || ! -d $1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "$1" && pwd)
TESTDATA=${MOESHARD_TESTDATA:-$BUILD/testdata}  # assembled by the build from tests/testdata
MODEL=$TESTDATA/qwen3moe-tok
PASSED=0
FAILED=0
pass() { echo "ok: $*"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL: $*"; FAILED=$((FAILED + 1)); }
finish() {
  if [[ -n ${UP_PID:-} ]]; then
    kill -TERM "$UP_PID" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$UP_PID" 2>/dev/null
    wait "$UP_PID" 2>/dev/null
  fi
  [[ $FAILED -eq 0 ]] && rm -rf "$WORK" || echo "security: logs in $WORK"
  echo "$PASSED passed, $FAILED failed"
}

[[ -x $BUILD/moeshard ]] || { echo "security: no $BUILD/moeshard (build it first)" >&2; exit 1; }
[[ -f $MODEL/config.json ]] || { echo "FAIL: no test model at $MODEL (set MOESHARD_TESTDATA)"; echo "0 passed, 1 failed"; exit 1; }
command -v node >/dev/null || { echo "FAIL: node is not installed (scripts/install_deps.sh)"; echo "0 passed, 1 failed"; exit 1; }
WORK=$(mktemp -d /tmp/moeshard-security.XXXXXX)
trap finish EXIT
if [[ ! -d $ROOT/tests/clients/node_modules ]]; then
  (cd "$ROOT/tests/clients" && npm ci --no-audit --no-fund >"$WORK/npm-ci.log" 2>&1) || { fail "npm ci in tests/clients; see $WORK/npm-ci.log"; exit 1; }
fi

KEY=sec-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
MOESHARD_API_KEY=$KEY setsid "$BUILD/moeshard" up --model "$MODEL" --workers 2 --mode layer-split \
  --host 127.0.0.1 --internal-host 127.0.0.2 --num-kv-blocks 256 >"$WORK/up.out" 2>"$WORK/up.err" &
UP_PID=$!
for _ in $(seq 1800); do
  grep -q '^moeshard up: ready' "$WORK/up.out" && break
  kill -0 "$UP_PID" 2>/dev/null || break
  sleep 0.1
done
if ! grep -q '^moeshard up: ready' "$WORK/up.out"; then
  fail "the cluster did not start: $(tail -n 3 "$WORK/up.err" | tr '\n' ' ')"
  exit 1
fi
URL=$(sed -n 's/^moeshard up: \(https\?:\/\/[^ ]*\) grpc .*/\1/p' "$WORK/up.out")
GRPC=$(sed -n 's/^moeshard up: https\?:\/\/[^ ]* grpc \(.*\)$/\1/p' "$WORK/up.out")
INTERNAL=$(sed -n 's/^moeshard up: internal //p' "$WORK/up.out")
METRICS=$(sed -n 's/^moeshard up: metrics //p' "$WORK/up.out" | head -1)
children=$(pgrep -P "$UP_PID")
pid_of() { for p in $children; do [[ $(cat "/proc/$p/comm" 2>/dev/null) == "$1" ]] && { echo "$p"; return; }; done; }
ROUTER_PID=$(pid_of moeshard-router)
WORKER_PID=$(pid_of moeshard-worker)
COORD_PID=$(pid_of moeshard-coordi)

# --host is for the router's API only: every internal service is on --internal-host.
bad=""
for kv in $INTERNAL; do [[ ${kv#*=} == 127.0.0.2:* ]] || bad+=" $kv"; done
if [[ -n $INTERNAL && -z $bad && $URL == http://127.0.0.1:* ]]; then
  pass "internal services on --internal-host only ($INTERNAL), the API on --host ($URL)"
else
  fail "bind addresses: internal '$INTERNAL'${bad:+ (wrong:$bad)}, API '$URL'"
fi

(cd "$ROOT/tests/security" &&
  MOESHARD_URL=$URL MOESHARD_GRPC=$GRPC MOESHARD_API_KEY=$KEY MOESHARD_INTERNAL=$INTERNAL MOESHARD_METRICS=$METRICS \
    MOESHARD_ROUTER_PID=$ROUTER_PID MOESHARD_WORKER_PID=$WORKER_PID MOESHARD_COORDINATOR_PID=$COORD_PID \
    MOESHARD_CLUSTER_PIDS="$UP_PID $children" \
    node --test --test-reporter=tap --test-concurrency=1 attacks.test.mjs) >"$WORK/attacks.log" 2>&1
np=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$WORK/attacks.log" | tail -1)
nf=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$WORK/attacks.log" | tail -1)
if [[ -z $np || -z $nf ]]; then
  fail "attacks.test.mjs ran to its end; see $WORK/attacks.log"
else
  PASSED=$((PASSED + np))
  FAILED=$((FAILED + nf))
  grep -E '^ *(not )?ok ' "$WORK/attacks.log" | sed 's/^/  /'
  [[ $nf -ne 0 ]] && grep -E '^not ok|^ *(error|expected|actual):' "$WORK/attacks.log" | head -30 | sed 's/^/    /'
fi
if kill -0 "$UP_PID" 2>/dev/null; then
  pass "the cluster is still up after the attacks"
else
  fail "the cluster died during the attacks: $(tail -n 3 "$WORK/up.err" | tr '\n' ' ')"
fi
[[ $FAILED -eq 0 ]]
