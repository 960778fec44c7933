# Sourced by the `moeshard check` test scripts: run EXPECTED_RC MODEL GOLDENS [check flags...]
# runs `$bin check`, prints ok or FAIL (with check's output) and sets fail=1 on a mismatch.
# Needs $bin; leaves check's output in $check_out.
check_out=$(mktemp)
trap 'rm -f "$check_out"' EXIT
fail=0
run() {
  local want=$1 model=$2 goldens=$3
  shift 3
  "$bin" check --model "$model" --goldens "$goldens" "$@" > "$check_out" 2>&1
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: check $model $* exited $rc (wanted $want)"; cat "$check_out"; fail=1
  else
    echo "ok: check $model $* exited $rc"
  fi
}
