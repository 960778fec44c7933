#!/usr/bin/env bash
# scripts/gpu_lane.sh's gtest step on fakes, no GPU: a fake nvidia-smi and fake gtest binaries
# that print gtest's summary lines and log when they start and end. Checks that every run of
# step 1 (the list's tests and their variants) is recorded, in the listed order, with the right
# verdict (a failing variant fails, a skipped multi-GPU case is allowed only with
# MOESHARD_ALLOW_SINGLE_GPU=1), that each variant's variables reach it, that runs overlap and that
# no more than MOESHARD_LANE_JOBS run at once.
#   tests/scripts/gpu_lane_test.sh REPO_ROOT
set -u
root=${1:?usage: gpu_lane_test.sh REPO_ROOT}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fails=0
check() {  # check NAME CONDITION-EXIT-STATUS
  if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
mkdir -p "$d/bin" "$d/path"
cat > "$d/path/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
echo "GPU 0: Fake GPU (UUID: GPU-0)"
SMI
# A fake gtest: its name and variables to a log; fails when FAKE_FAIL_IF names one of its
# variables' values; nccl_communicator_test skips one case (exit 77, as tests/gpu_test_main.cc).
cat > "$d/fake_gtest" <<'FAKE'
#!/usr/bin/env bash
name=$(basename "$0")
vars=$(env | grep -E '^MOESHARD_(GEMV|RESIDUAL|MOE)_' | LC_ALL=C sort | tr '\n' ' ')
echo "start $name $vars" >> "$FAKE_LOG"
# The last variant: has the lane already recorded the first run (results stream, in order)?
case " $vars" in
  *" MOESHARD_MOE_SW_PAIR=4 "*) grep -q '^== ok op_harness_test' "$FAKE_OUT" && echo "first recorded before the last start" >> "$FAKE_LOG" ;;
esac
sleep "${FAKE_SLEEP:-0.3}"
echo "end $name" >> "$FAKE_LOG"
echo "$vars"
if [ "$name" = nccl_communicator_test ]; then
  echo "[==========] 3 tests from 1 test suite ran. (1 ms total)"
  echo "[  PASSED  ] 2 tests."
  echo "[  SKIPPED ] 1 test, listed below:"
  echo "[  SKIPPED ] Nccl.TwoGpus (0 ms)"
  exit 77
fi
echo "[==========] 5 tests from 2 test suites ran. (1 ms total)"
case " $vars" in
  *" $FAKE_FAIL_IF "*) echo "[  FAILED  ] 1 test"; exit 1 ;;
esac
echo "[  PASSED  ] 5 tests."
FAKE
chmod +x "$d/path/nvidia-smi" "$d/fake_gtest"
tests=(op_harness_test model_ops_test gemv_test qk_prep_test moe_expert_test nccl_communicator_test)
for t in "${tests[@]}"; do ln -s "$d/fake_gtest" "$d/bin/$t"; done
printf '#!/usr/bin/env bash\nexit 1\n' > "$d/bin/testdata_gguf"  # no test models: the checks after step 1 fail
chmod +x "$d/bin/testdata_gguf"
printf '%s\n' "${tests[@]}" > "$d/list.txt"

lane() {  # lane JOBS ALLOW [VAR=VALUE...]: runs step 1 (and the checks after it, which fail on the fakes)
  local jobs=$1 allow=$2
  shift 2
  : > "$d/log"
  env PATH="$d/path:$PATH" FAKE_LOG="$d/log" FAKE_OUT="$d/out" FAKE_FAIL_IF=MOESHARD_MOE_SW_TOK=96 \
    MOESHARD_LANE_JOBS="$jobs" MOESHARD_ALLOW_SINGLE_GPU="$allow" MOESHARD_LANE_PART=checks MOESHARD_LANE_LONG=0 \
    MOESHARD_LANE_TESTS="$d/list.txt" "$@" timeout 120 bash "$root/scripts/gpu_lane.sh" run "$d/bin" > "$d/out" 2>&1
  local logs
  logs=$(sed -n 's/^gpu lane: logs in \(\/tmp\/moeshard-gpu-lane\.[A-Za-z0-9]*\)$/\1/p' "$d/out")
  [ -n "$logs" ] && rm -rf "$logs"
}
# The most runs at once in the fakes' log.
most() { awk '$1 == "start" {n++; if (n > m) m = n} $1 == "end" {n--} END {print m + 0}' "$d/log"; }

lane 3 1
# The recorded gtest lines, names only, in order (step 1's; gpu_check and the repack check follow).
grep -oE '^== (ok|FAIL|skip) [A-Za-z0-9_-]+' "$d/out" | awk '{print $3}' | grep -vE '^(testdata|gpu_check|gpu_repack_check)$' > "$d/names"
want="op_harness_test model_ops_test gemv_test qk_prep_test moe_expert_test nccl_communicator_test gemv_test-group4
gemv_test-nosplit model_ops_test-residual-wide model_ops_test-residual-narrow moe_expert_test-classes
moe_expert_test-no-stream-direct moe_expert_test-no-down-early moe_expert_test-per-sm moe_expert_test-wgmma-repacked
moe_expert_test-no-stream-wgmma moe_expert_test-stream-wgmma-all moe_expert_test-stream-wgmma-all-no-pair
moe_expert_test-stream-split moe_expert_test-stream-wgmma-tok32 moe_expert_test-stream-wgmma-tok96
moe_expert_test-stream-wgmma-tok112 moe_expert_test-stream-wgmma-tok128 moe_expert_test-stream-wgmma-pair
moe_expert_test-stream-wgmma-pair-dyn"
[ "$(tr '\n' ' ' < "$d/names")" = "$(tr '\n' ' ' <<< "$want")" ]
check "every run recorded, in the listed order ($(wc -l < "$d/names") runs)" $?
[ "$(grep -c '^start ' "$d/log")" = "$(wc -l < "$d/names")" ]
check "each run started once" $?
grep -q '^== FAIL moe_expert_test-stream-wgmma-tok96: exit 1' "$d/out"
check "a failing variant is a failure" $?
[ "$(grep -c '^== FAIL moe_expert_test' "$d/out")" = 1 ]
check "only that variant fails" $?
grep -q '^== skip nccl_communicator_test: 3 cases, 1 skipped and allowed' "$d/out"
check "a skipped multi-GPU case is allowed with MOESHARD_ALLOW_SINGLE_GPU=1" $?
grep -q '^start moe_expert_test MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 MOESHARD_MOE_SW_DYN=1 MOESHARD_MOE_SW_PAIR=4 $' "$d/log"
check "a variant's variables reach its run" $?
grep -q '^start model_ops_test MOESHARD_RESIDUAL_WIDE=0 $' "$d/log"
check "the residual variant's variable reaches it" $?
m=$(most)
[ "$m" -ge 2 ] && [ "$m" -le 3 ]
check "runs overlap, at most MOESHARD_LANE_JOBS=3 at once (most: $m)" $?
tail -1 "$d/out" | grep -qE '^gpu lane \(checks\): .*: [0-9]+ passed, [0-9]+ failed, 1 skipped \(allowed\)$'
check "the summary line counts the allowed skip" $?

grep -q '^first recorded before the last start$' "$d/log"
check "results are recorded as runs end, before the last run starts" $?

lane 1 0 FAKE_SLEEP=0.05
[ "$(most)" = 1 ]
check "MOESHARD_LANE_JOBS=1 runs one at a time" $?
grep -q '^== FAIL nccl_communicator_test: 1 case(s) skipped' "$d/out"
check "without MOESHARD_ALLOW_SINGLE_GPU a skipped case fails" $?

lane "" 1 MOESHARD_LANE_SERIAL=1 FAKE_SLEEP=0.05
[ "$(most)" = 1 ] && [ "$(grep -c '^start ' "$d/log")" = "$(wc -l < "$d/names")" ]
check "MOESHARD_LANE_SERIAL=1 runs them one at a time too" $?
lane 0 1 FAKE_SLEEP=0.05
[ "$(most)" = 1 ] && [ "$(grep -c '^start ' "$d/log")" = "$(wc -l < "$d/names")" ]
check "MOESHARD_LANE_JOBS=0 runs them one at a time (not a hang)" $?
lane abc 1 FAKE_SLEEP=0.05
[ "$(most)" = 1 ] && grep -q '^== ok moe_expert_test-stream-wgmma-pair-dyn' "$d/out"
check "a non-numeric MOESHARD_LANE_JOBS runs them one at a time" $?

[ $fails = 0 ] || { echo "--- last lane output:"; sed 's/^/  /' "$d/out" | head -80; }
exit $((fails > 0))
