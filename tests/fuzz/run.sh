#!/usr/bin/env bash
# Runs each libFuzzer target of BUILD_DIR/fuzz for SECONDS from its committed seed corpus
# (new inputs go to a scratch folder, not the repo); a crash, leak, timeout or sanitizer
# report fails it and leaves the input in the scratch folder. Targets run side by side, one a core.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[[ $# -ge 1 ]] || { echo "usage: run.sh BUILD_DIR [SECONDS]" >&2; exit 2; }
BUILD=$(cd "$1" && pwd) || { echo "run.sh: no folder $1" >&2; exit 2; }
SECONDS_EACH=${2:-10}
export MOESHARD_TESTDATA=${MOESHARD_TESTDATA:-$ROOT/build/testdata}  # assembled by the release build (make test-fuzz depends on it)
WORK=$(mktemp -d /tmp/moeshard-fuzz.XXXXXX)
# fuzz_one NAME SEEDS: runs one target; prints its lines to WORK/NAME.result and exits 1 on a failure.
fuzz_one() {
  local name=$1 seeds=$2 bin=$BUILD/fuzz/$1 t0=$SECONDS runs unit
  if [[ ! -x $bin ]]; then
    echo "FAIL: $name: no $bin (build it first)"
    return 1
  fi
  mkdir -p "$WORK/$name"
  if (cd "$WORK/$name" && "$bin" -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
        "$WORK/$name" "$seeds") >"$WORK/$name.log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$WORK/$name.log")
    echo "ok: $name: ${runs:-?} inputs in $((SECONDS - t0)) s, $(ls "$seeds" | wc -l) seeds"
    return 0
  fi
  echo "FAIL: $name: see $WORK/$name.log"
  # libFuzzer's and the sanitizers' own lines (not the parsers' logged complaints), then the
  # input that failed, in base64, so the failure can be replayed from the CI log alone.
  grep -E '^==[0-9]+==|^SUMMARY|deadly signal|out-of-memory|timeout after|ERROR: libFuzzer|Test unit written' \
    "$WORK/$name.log" | grep -v libprotobuf | head -12 | sed 's/^/    /'
  for unit in "$WORK/$name"/crash-* "$WORK/$name"/leak-* "$WORK/$name"/timeout-* "$WORK/$name"/oom-*; do
    [[ -f $unit ]] || continue
    echo "    $(basename "$unit") (replay: $bin FILE): $(head -c 4096 "$unit" | base64 -w0)"
  done
  tail -5 "$WORK/$name.log" | sed 's/^/    | /'
  return 1
}

# One target per core at a time (MOESHARD_FUZZ_JOBS overrides); each still runs SECONDS.
jobs_max=${MOESHARD_FUZZ_JOBS:-$(nproc)}
names=()
for seeds in "$ROOT"/tests/fuzz/corpus/*/; do
  name=$(basename "$seeds")
  names+=("$name")
  while [[ $(jobs -rp | wc -l) -ge $jobs_max ]]; do wait -n; done
  (fuzz_one "$name" "$seeds" > "$WORK/$name.result"; echo $? > "$WORK/$name.rc") &
done
wait
passed=0 failed=0
for name in "${names[@]}"; do
  cat "$WORK/$name.result"
  if [[ $(cat "$WORK/$name.rc" 2>/dev/null) == 0 ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
[[ $failed -eq 0 ]] && rm -rf "$WORK"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
