# shellcheck shell=bash
# Helpers of the wgmma-GEMM device scripts (bench/moe_sw_ab.sh, moe_sw_pair.sh, moe_sw_profile.sh);
# sourced, not run. Each script sets `rc=0` first; sw_test sets it to 1 when a test fails.
export NCCL_NVLS_ENABLE=0

# log WORDS...: a step's heading with the UTC time.
log() { echo "== $(date -u +%H:%M:%S) $*"; }

# sw_need SCRIPT FILE...: exits 2 unless every FILE is executable.
sw_need() {
  local script=$1 p
  shift
  for p in "$@"; do
    [ -x "$p" ] || { echo "$script: no $p" >&2; exit 2; }
  done
}

# sw_test SCRIPT TEST_BIN NAME [VAR=VALUE...]: moe_expert_test with those variables, its verdict, its
# path counts and any failure (the whole log in /tmp/SCRIPT_NAME.log).
sw_test() {
  local script=$1 test_bin=$2 name=$3
  shift 3
  local out=/tmp/${script}_$name.log
  # shellcheck disable=SC2034  # rc is the sourcing script's
  env "$@" "$test_bin" >"$out" 2>&1 || rc=1
  log "moe_expert_test $name ($*): $(grep -E '^\[  (PASSED|FAILED) ' "$out" | tr '\n' ' ')"
  grep -E 'paths:|Failure|FAILED' -A2 "$out" | head -12
}
