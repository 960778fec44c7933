#!/usr/bin/env bash
# The GPU lane: every GPU check in one run with one summary. Two steps.
#
#   scripts/gpu_lane.sh bundle BUILD_DIR       (here, on a CUDA build: -DMOESHARD_CUDA=ON)
#       rebuilds and packs .device/bundle (../shared/tools/device-bundle.sh: moeshard, its services,
#       testdata_gguf and every test binary ctest labels gpu) and .device/gpu_tests.txt (those
#       tests' names, from `ctest -L gpu -N`).
#   scripts/gpu_lane.sh run [BIN_DIR]           (on the GPU machine, from the repository root)
#       BIN_DIR defaults to .device/bundle/bin (source .device/bundle/env.sh first). Runs, each
#       with its result on one line:
#         1. every gpu-labelled gtest in .device/gpu_tests.txt (gpu_model_check and
#            gpu_repack_check are steps 2 and 3);
#         2. scripts/gpu_check.sh: every test model in bf16 and float32, one worker, layer split
#            and tensor parallel;
#         3. scripts/gpu_repack_check.sh: the NVFP4 repack against the CPU;
#         3b. scripts/gpu_long_check.sh: the long goldens (qwen3moe-tiny at 131,072 tokens, written
#            by tests/testdata/make_long_goldens.py into $MOESHARD_LONG_GOLDENS when it lacks them,
#            and the committed 16K ones) in float32, bf16 and bf16 with FP8 KV, one worker, TP 2,
#            layer split 2
#            (MOESHARD_LANE_LONG=0 leaves it out);
#         4. tests/e2e/run.sh with every cluster's workers on the GPU in bfloat16, the suite
#            comparing with the bf16 tolerance (`itest --tolerance bf16`: tokens equal up to a
#            near tie of the float32 engine, logprobs within 0.5 nats, or what the float32 engine
#            gives with one of its nearest router ties decided the other way);
#         5. the same in float32, compared exactly (MOESHARD_LANE_FLOAT32_E2E=0 leaves it out).
#       Steps 4 and 5 start first and run in the background beside 1-3, each with its own clusters
#       (MOESHARD_LANE_SERIAL=1: everything one after another).
#       The test models are assembled from tests/testdata first (tests/testdata/assemble.sh).
#       gemv_test runs a second time with MOESHARD_GEMV_MMA_GROUP8=0 (GEMV launches grouped by
#       the fp32-x count instead of the tensor-core kernel's 8 tokens) as gemv_test-group4, and
#       with MOESHARD_GEMV_SPLITK=0 (launches of few rows not split by columns) as gemv_test-nosplit,
#       model_ops_test's residual cases with MOESHARD_RESIDUAL_WIDE=1 (plain rows of 4,097-8,192 in
#       1,024 threads too) as model_ops_test-residual-wide and with MOESHARD_RESIDUAL_WIDE=0 (gated
#       ones on the loop kernel) as model_ops_test-residual-narrow, and moe_expert_test with MOESHARD_MOE_GEMV_SMALL_ALL=0 (both GEMV task classes at every
#       size) as moe_expert_test-classes, and with MOESHARD_MOE_STREAM_DIRECT=0 (the route and
#       the streaming kernels at decode sizes) as moe_expert_test-no-stream-direct, and with
#       MOESHARD_MOE_WGMMA_REPACKED=1 (prefill of repacked experts on wgmma) as
#       moe_expert_test-wgmma-repacked, with MOESHARD_MOE_STREAM_WGMMA=0 (the streaming kernels at
#       prefill sizes) as moe_expert_test-no-stream-wgmma and with
#       MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 (wgmma over decoded registers at every size) as
#       moe_expert_test-stream-wgmma-all (the pair step by the rule; -all-no-pair: with
#       MOESHARD_MOE_SW_PAIR=0, 64-token items), with items forced to 96, 112 and 128 tokens as
#       moe_expert_test-stream-wgmma-tok96 / -tok112 / -tok128 (and -tok32: the two-CTA kernel of
#       32-token items for every expert), with the pair step forced (MOESHARD_MOE_SW_PAIR=3
#       MOESHARD_MOE_SW_DYN=0: that kernel, its items strided, beside the 128-token one) as
#       moe_expert_test-stream-wgmma-pair (and -pair-dyn: the default order, the 128-token kernel first
#       and the two-CTA one drawing its items, =4 MOESHARD_MOE_SW_DYN=1), and with every
#       prefill step split by experts' rows (MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1000000
#       MOESHARD_MOE_SW_SPLIT_ROWS=48) as
#       moe_expert_test-stream-split.
#       MOESHARD_LANE_PART=checks runs steps 1-3b only, =e2e steps 4-5 only (default all): the
#       two halves' bundles each fit one device call's 64 MiB beside the tree (the whole stripped
#       bundle, xz-packed, fits beside the tree without tests/testdata/long-goldens: all but 3b in
#       one call, 202 s on an H100, 2026-12-06).
#       Step 1's gtest runs (those of the list and the variants) go out in the background,
#       MOESHARD_LANE_JOBS (default 4; 1 under MOESHARD_LANE_SERIAL=1) at a time, and are recorded
#       in their listed order, each once it and the runs before it have ended (each
#       moe_expert_test run is ~31 s, mostly its CPU reference: one after another step 1 takes
#       ~630 s on an H100, 2026-12-06); MOESHARD_LANE_TESTS names another list than
#       .device/gpu_tests.txt (tests/scripts/gpu_lane_test.sh runs the step on fakes, no GPU).
#       A step that exits 77 (no GPU) is a failure here: the lane runs on a GPU machine. A gtest
#       that reports SKIPPED (a multi-GPU case on one GPU, say nccl_communicator_test) fails the
#       lane unless MOESHARD_ALLOW_SINGLE_GPU=1, which lists it as allowed.
#       Last line: `gpu lane: DATE COMMIT: N passed, M failed, K skipped (allowed)`; exits 1 on
#       any failure. Record it in docs/TESTING.md.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE=$ROOT/.device

bundle() {
  local build=${1:?usage: gpu_lane.sh bundle BUILD_DIR}
  local tests
  tests=$(cd "$build" && ctest -L gpu -N | sed -n 's/^ *Test *#[0-9]*: \([A-Za-z0-9_]*\)$/\1/p')
  local progs=("$build/moeshard" "$build/tests/testdata_gguf" "$build/tests/moeshard-itest")
  for p in moeshard-router moeshard-coordinator moeshard-worker; do
    if [[ -x $build/$p ]]; then
      progs+=("$build/$p")
    else
      echo "gpu lane: no $build/$p (build every target first)" >&2
      return 1
    fi
  done
  mkdir -p "$DEVICE"
  : >"$DEVICE/gpu_tests.txt.tmp"
  local targets=(moeshard moeshard-router moeshard-coordinator moeshard-worker testdata_gguf moeshard-itest)
  for t in $tests; do
    [[ -x $build/tests/$t ]] && { progs+=("$build/tests/$t"); targets+=("$t"); echo "$t" >>"$DEVICE/gpu_tests.txt.tmp"; }
  done
  # Every binary packed is rebuilt from this tree first: a test binary left from another
  # checkout (a branch) would otherwise travel and fail, or pass, for code that is not here.
  cmake --build "$build" --target "${targets[@]}" >/dev/null || { echo "gpu lane: the build of ${targets[*]} failed" >&2; return 1; }
  mv "$DEVICE/gpu_tests.txt.tmp" "$DEVICE/gpu_tests.txt"
  # The commit the bundle was built from (the GPU machine's copy of the tree may carry other git
  # metadata): the lane's summary names it.
  git -C "$ROOT" rev-parse --short HEAD >"$DEVICE/commit.txt" 2>/dev/null || rm -f "$DEVICE/commit.txt"
  bash "$ROOT/../shared/tools/device-bundle.sh" "$DEVICE/bundle" "${progs[@]}"
  echo "gpu lane: bundled $(wc -l <"$DEVICE/gpu_tests.txt") gpu gtests: $(tr '\n' ' ' <"$DEVICE/gpu_tests.txt")"
}

PASSED=0 FAILED=0 SKIPPED=0
SUMMARY=()
record() {  # record VERDICT NAME DETAIL
  case $1 in
    ok) PASSED=$((PASSED + 1)) ;;
    skip) SKIPPED=$((SKIPPED + 1)) ;;
    *) FAILED=$((FAILED + 1)) ;;
  esac
  SUMMARY+=("$1 $2: $3")
  echo "== $1 $2: $3"
}

# run_step NAME LOG CMD...: one step; exit 0 passes, anything else (77 included) fails.
run_step() {
  local name=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1
  local rc=$?
  local last
  last=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  if [[ $rc -eq 0 ]]; then
    record ok "$name" "${last:-exit 0}"
  else
    record FAIL "$name" "exit $rc${last:+, $last}; see $log"
    tail -n 15 "$log" | sed 's/^/    /'
  fi
}

# The gtest runs of step 1 go out as background jobs, at most MOESHARD_LANE_JOBS (default 4;
# 1 under MOESHARD_LANE_SERIAL=1) at a time — each run's CPU reference and setup dominate it; the
# GPU takes the processes' kernels in turn — and are recorded in the order they were started, each
# as soon as it and every run before it have ended (a lane cut short still reports those).
GTEST_PIDS=() GTEST_JOBS=() GTEST_NEXT=0
gtest_jobs() {
  local jobs=${MOESHARD_LANE_JOBS:-}
  if [[ -z $jobs && ${MOESHARD_LANE_SERIAL:-0} == 1 ]]; then
    jobs=1
  elif [[ -z $jobs ]]; then
    jobs=4
  fi
  [[ $jobs =~ ^[1-9][0-9]*$ ]] || jobs=1
  echo "$jobs"
}
# A started run is live until its exit status is written (LOG.rc) or its process is gone.
gtest_live() {  # gtest_live I
  local log=${GTEST_JOBS[$1]#*|}
  [[ ! -e $log.rc ]] && kill -0 "${GTEST_PIDS[$1]}" 2>/dev/null
}
judge_ready() {  # records the runs at the head of the queue that have ended
  while [[ $GTEST_NEXT -lt ${#GTEST_PIDS[@]} ]] && ! gtest_live "$GTEST_NEXT"; do
    wait "${GTEST_PIDS[$GTEST_NEXT]}" 2>/dev/null
    judge_gtest "${GTEST_JOBS[$GTEST_NEXT]%%|*}" "${GTEST_JOBS[$GTEST_NEXT]#*|}"
    GTEST_NEXT=$((GTEST_NEXT + 1))
  done
}
start_gtest() {  # start_gtest TEST BIN_DIR LOG [NAME [VAR=VALUE...]]: NAME in the summary, the variables set for it
  local t=$1 bin=$2 log=$3 name=${4:-$1}
  shift 3
  [[ $# -gt 0 ]] && shift
  local jobs live i
  jobs=$(gtest_jobs)
  while :; do
    judge_ready
    live=0
    for ((i = GTEST_NEXT; i < ${#GTEST_PIDS[@]}; i++)); do gtest_live "$i" && live=$((live + 1)); done
    [[ $live -lt $jobs ]] && break
    sleep 0.2
  done
  rm -f "$log.rc"
  (env "$@" MOESHARD_TESTDATA="${data:-${MOESHARD_TESTDATA:-}}" "$bin/$t" >"$log" 2>&1; echo $? >"$log.rc") &
  GTEST_PIDS+=($!)
  GTEST_JOBS+=("$name|$log")
}

judge_gtests() {  # waits for every started gtest run, recording each in start order
  while [[ $GTEST_NEXT -lt ${#GTEST_PIDS[@]} ]]; do
    judge_ready
    [[ $GTEST_NEXT -lt ${#GTEST_PIDS[@]} ]] && sleep 0.2
  done
  GTEST_PIDS=() GTEST_JOBS=() GTEST_NEXT=0
}

judge_gtest() {  # judge_gtest NAME LOG: the run's exit status from LOG.rc, its counts from LOG
  local name=$1 log=$2
  local rc
  rc=$(cat "$log.rc" 2>/dev/null || echo "?")
  local ran skipped
  ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran\..*/\1/p' "$log" | tail -1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?, listed below:$/\1/p' "$log" | tail -1)
  skipped=${skipped:-0}
  # 77 is also what a gpu test returns when one of its cases skipped (tests/gpu_test_main.cc):
  # with cases run and a count of skipped ones, it is a skip, judged below.
  if [[ $rc == 77 && ${ran:-0} -gt $skipped && $skipped -gt 0 ]]; then
    rc=0
  fi
  if [[ $rc == "?" ]]; then
    record FAIL "$name" "no exit status recorded (killed?); see $log"
    tail -n 15 "$log" | sed 's/^/    /'
  elif [[ $rc != 0 ]]; then
    record FAIL "$name" "exit $rc (77: no GPU seen); see $log"
    tail -n 15 "$log" | sed 's/^/    /'
  elif [[ $skipped -gt 0 && ${MOESHARD_ALLOW_SINGLE_GPU:-0} != 1 ]]; then
    record FAIL "$name" "$skipped case(s) skipped (multi-GPU on this machine? MOESHARD_ALLOW_SINGLE_GPU=1 allows it): $(grep '^\[  SKIPPED \] [A-Za-z].*(' "$log" | head -3 | tr '\n' ' ')"
  elif [[ $skipped -gt 0 ]]; then
    record skip "$name" "${ran:-?} cases, $skipped skipped and allowed (MOESHARD_ALLOW_SINGLE_GPU=1)"
  else
    record ok "$name" "${ran:-?} cases, none skipped"
  fi
}

run_lane() {
  local bin=${1:-$DEVICE/bundle/bin}
  bin=$(cd "$bin" && pwd)
  local work
  work=$(mktemp -d /tmp/moeshard-gpu-lane.XXXXXX)
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >"$work/gpus.txt" 2>&1; then
    echo "gpu lane: no GPU here (nvidia-smi -L fails); the lane runs on the GPU machine" >&2
    exit 1
  fi
  echo "gpu lane: $(wc -l <"$work/gpus.txt") GPU(s): $(head -1 "$work/gpus.txt")"
  local data=$work/testdata
  if ! bash "$ROOT/tests/testdata/assemble.sh" "$bin/testdata_gguf" "$data" >"$work/assemble.log" 2>&1; then
    record FAIL testdata "assemble.sh failed; see $work/assemble.log"
  fi
  # The e2e runs (bf16 workers compared with the bf16 tolerance, tests/itest/token_match.h; then
  # float32, compared exactly) start first, in the background, each its own clusters on ports
  # chosen at run time: the GPU and 16 cores hold them beside the gtests and checks above.
  # MOESHARD_LANE_SERIAL=1 runs everything one after another. MOESHARD_E2E_ONLY
  # (tests/e2e/run.sh) narrows both to some clusters.
  local e2e_pids=() e2e_names=()
  e2e_step() {  # e2e_step NAME DTYPE [EXTRA ITEST ARGS]
    local name=$1 dtype=$2 itest=${3:-}
    local cmd=(env MOESHARD_E2E_NODE="${MOESHARD_E2E_NODE:-0}" MOESHARD_TESTDATA="$data"
      MOESHARD_E2E_UP_ARGS="--device cuda --dtype $dtype" MOESHARD_E2E_ITEST_ARGS="$itest"
      bash "$ROOT/tests/e2e/run.sh" "$bin")
    if [[ ${MOESHARD_LANE_SERIAL:-0} == 1 ]]; then
      run_step "$name" "$work/$name.log" "${cmd[@]}"
    else
      ("${cmd[@]}" >"$work/$name.log" 2>&1; echo $? >"$work/$name.rc") &
      e2e_pids+=($!)
      e2e_names+=("$name")
    fi
  }
  local part=${MOESHARD_LANE_PART:-all}
  if [[ $part != all && $part != checks && $part != e2e ]]; then
    record FAIL lane "MOESHARD_LANE_PART is all, checks or e2e (got '$part')"
    part=none
  fi
  if [[ $part == all || $part == e2e ]]; then
    e2e_step e2e-bfloat16 bfloat16 "--tolerance bf16"
    [[ ${MOESHARD_LANE_FLOAT32_E2E:-1} == 1 ]] && e2e_step e2e-float32 float32
  fi
  local list=${MOESHARD_LANE_TESTS:-$DEVICE/gpu_tests.txt}
  if [[ $part != all && $part != checks ]]; then
    :
  elif [[ ! -s $list ]]; then
    record FAIL gtests "no $list (run scripts/gpu_lane.sh bundle BUILD_DIR here first)"
  else
    while read -r t; do
      [[ $t == gpu_model_check || $t == gpu_repack_check ]] && continue
      start_gtest "$t" "$bin" "$work/$t.log"
    done <"$list"
    # Split-Q8 GEMVs grouped by the fp32-x count (MOESHARD_GEMV_MMA_GROUP8=0; the default groups
    # 8 tokens for the tensor-core kernel, kernels/cuda/gemv.h): that path stays checked too.
    if grep -qx gemv_test "$list"; then
      start_gtest gemv_test "$bin" "$work/gemv_test-group4.log" gemv_test-group4 MOESHARD_GEMV_MMA_GROUP8=0
    fi
    # GEMV launches of few rows not split by columns (MOESHARD_GEMV_SPLITK=0; the default splits
    # them over a block's warps; ctest's gemv_test_nosplit).
    if grep -qx gemv_test "$list"; then
      start_gtest gemv_test "$bin" "$work/gemv_test-nosplit.log" gemv_test-nosplit MOESHARD_GEMV_SPLITK=0
    fi
    # Residual rows of 4,097-8,192: plain ones in 1,024 threads too (MOESHARD_RESIDUAL_WIDE=1), gated
    # ones on the loop kernel (=0); ctest's model_ops_test_residual_wide / _narrow.
    if grep -qx model_ops_test "$list"; then
      start_gtest model_ops_test "$bin" "$work/model_ops_test-residual-wide.log" model_ops_test-residual-wide \
        MOESHARD_RESIDUAL_WIDE=1 'GTEST_FILTER=*Residual*'
      start_gtest model_ops_test "$bin" "$work/model_ops_test-residual-narrow.log" model_ops_test-residual-narrow \
        MOESHARD_RESIDUAL_WIDE=0 'GTEST_FILTER=*Residual*'
    fi
    # The MoE GEMV's two task classes at every size (MOESHARD_MOE_GEMV_SMALL_ALL=0; up to 512
    # pairs the default lets the small class take every task, kernels/moe/moe_gemv.cu).
    if grep -qx moe_expert_test "$list"; then
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-classes.log" moe_expert_test-classes \
        MOESHARD_MOE_GEMV_SMALL_ALL=0
    fi
    # Without the direct GEMV over the repacked layouts (kernels/moe/moe_stream_direct.cu, on by
    # default): the streaming kernels at decode sizes (ctest's moe_expert_test_no_stream_direct).
    if grep -qx moe_expert_test "$list"; then
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-no-stream-direct.log" moe_expert_test-no-stream-direct \
        MOESHARD_MOE_STREAM_DIRECT=0
      # The direct down kernels waiting before their first weights (ctest's moe_expert_test_no_down_early).
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-no-down-early.log" moe_expert_test-no-down-early \
        MOESHARD_MOE_DOWN_EARLY=0
      # The block form's grids capped at one block an SM (MOESHARD_MOE_DIRECT_PER_SM_*: each block
      # walks the most units; ctest's moe_expert_test_per_sm).
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-per-sm.log" moe_expert_test-per-sm \
        MOESHARD_MOE_DIRECT_PER_SM_GATEUP=1 MOESHARD_MOE_DIRECT_PER_SM_DOWN=1
      # The prefill shapes' repacked MXFP4 / Q8_0 experts through the wgmma GEMMs (off by default
      # until it has passed here; ctest's moe_expert_test_wgmma_repacked).
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-wgmma-repacked.log" moe_expert_test-wgmma-repacked \
        MOESHARD_MOE_WGMMA_REPACKED=1
      # Repacked NVFP4 / MXFP4 experts at prefill sizes without the wgmma GEMMs over decoded
      # registers (kernels/moe/moe_stream_wgmma.cu), then through them at every size past the
      # direct GEMV's (ctest's moe_expert_test_no_stream_wgmma, _stream_wgmma_all).
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-no-stream-wgmma.log" moe_expert_test-no-stream-wgmma \
        MOESHARD_MOE_STREAM_WGMMA=0
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-stream-wgmma-all.log" moe_expert_test-stream-wgmma-all \
        MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-stream-wgmma-all-no-pair.log" \
        moe_expert_test-stream-wgmma-all-no-pair MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 MOESHARD_MOE_SW_PAIR=0
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-stream-split.log" moe_expert_test-stream-split \
        MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1000000 MOESHARD_MOE_SW_SPLIT_ROWS=48
      for tok in 32 96 112 128; do  # the other kernel forms (ctest's moe_expert_test_stream_wgmma_tok*)
        start_gtest moe_expert_test "$bin" "$work/moe_expert_test-stream-wgmma-tok$tok.log" \
          "moe_expert_test-stream-wgmma-tok$tok" MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 "MOESHARD_MOE_SW_TOK=$tok"
      done
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-stream-wgmma-pair.log" moe_expert_test-stream-wgmma-pair \
        MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 MOESHARD_MOE_SW_PAIR=3 MOESHARD_MOE_SW_DYN=0
      start_gtest moe_expert_test "$bin" "$work/moe_expert_test-stream-wgmma-pair-dyn.log" \
        moe_expert_test-stream-wgmma-pair-dyn MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 MOESHARD_MOE_SW_PAIR=4 \
        MOESHARD_MOE_SW_DYN=1
    fi
    judge_gtests
  fi
  if [[ $part == all || $part == checks ]]; then
    run_step gpu_check "$work/gpu_check.log" bash "$ROOT/scripts/gpu_check.sh" "$bin" "$data"
    run_step gpu_repack_check "$work/repack.log" bash "$ROOT/scripts/gpu_repack_check.sh" "$bin"
  fi
  if [[ ${MOESHARD_LANE_LONG:-1} == 1 && ($part == all || $part == checks) ]]; then
    run_step gpu_long_check "$work/long.log" bash "$ROOT/scripts/gpu_long_check.sh" "$bin" "$data" \
      "${MOESHARD_LONG_GOLDENS:-$work/long-goldens}"
  fi
  local i
  for i in "${!e2e_pids[@]}"; do
    wait "${e2e_pids[$i]}"
    local name=${e2e_names[$i]} rc last
    rc=$(cat "$work/$name.rc" 2>/dev/null || echo "?")
    last=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$work/$name.log" | tail -1)
    if [[ $rc == 0 ]]; then
      record ok "$name" "${last:-exit 0}"
    else
      record FAIL "$name" "exit $rc${last:+, $last}; see $work/$name.log"
      grep -E '^FAIL|^ *FAIL' "$work/$name.log" | head -20 | sed 's/^/    /'
    fi
  done
  local commit
  commit=$(cat "$DEVICE/commit.txt" 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  echo "gpu lane: logs in $work"
  printf '  %s\n' "${SUMMARY[@]}"
  local label=""
  [[ $part != all ]] && label=" ($part)"
  echo "gpu lane$label: $(date -u +%Y-%m-%dT%H:%MZ) $commit: $PASSED passed, $FAILED failed, $SKIPPED skipped (allowed)"
  [[ $FAILED -eq 0 ]]
}

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  run) shift; run_lane "$@" ;;
  *) echo "usage: scripts/gpu_lane.sh bundle BUILD_DIR | run [BIN_DIR]" >&2; exit 2 ;;
esac
