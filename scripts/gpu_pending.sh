#!/usr/bin/env bash
# The GPU work that waits for a device (written 2026-12-05, when none was lent): every check and
# measurement of the kernels that have not yet run, in two parts that each fit one device call.
#   part 1 (checks and kernel timings, ~5 min):
#     moe_expert_test, then with MOESHARD_MOE_STREAM_DIRECT=1 (the direct GEMV over the repacked
#       layout) — the Q8_0 repacked cases (MoeRepackQ8) run in both;
#     scripts/gpu_repack_check.sh (whole-model KL, repacked against stored: NVFP4, MXFP4, Q8_0);
#     moe_expert_bench at the Qwen3-30B shape, MXFP4 and Q8_0, T = 1, 4, 16, 64: the streaming
#       layout (default), the same with MOESHARD_MOE_STREAM_DIRECT=1, and the stored blocks.
#   part 2 (bench-model, the 48-layer Qwen3-30B shape, dense Q8_0, 640 tokens of context, 1 / 4 / 16 /
#     64 streams, ~5 min): MXFP4 experts stored (auto), repacked (stream), repacked with the direct
#     GEMV; Q8_0 experts stored, repacked (stream with MOESHARD_MOE_STREAM_Q8=1), repacked with the
#     direct GEMV; and Muse Spark's 8
#     full-width NVFP4 layers at 4K context, 1 / 4 streams, with and without the direct GEMV.
# Each run's output goes to OUT/NAME.log; OUT/summary.txt lists each step's verdict and time, and
# the lines of each log that carry its result.
#   scripts/gpu_pending.sh BIN_DIR OUT [1|2|all]
# BIN_DIR holds moeshard, moe_expert_test and moe_expert_bench (a device bundle's bin/).
# Exits 77 without a GPU; 1 when a check failed (the measurements run regardless).
set -uo pipefail
bin=${1:?usage: gpu_pending.sh BIN_DIR OUT [1|2|all]}
out=${2:?usage: gpu_pending.sh BIN_DIR OUT [1|2|all]}
part=${3:-all}
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIPPED: no CUDA device"; exit 77
fi
mkdir -p "$out"
summary=$out/summary.txt
failed=0
step() {  # step NAME KIND(check|measure) GREP ENV... -- CMD...: run, log, record
  local name=$1 kind=$2 pattern=$3 env=()
  shift 3
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  shift
  local t0=$SECONDS rc
  env "${env[@]}" "$@" > "$out/$name.log" 2>&1
  rc=$?
  local verdict=ok
  if [ $rc -ne 0 ]; then
    verdict="FAILED (exit $rc)"
    [ "$kind" = check ] && failed=1
  fi
  { echo "== $name: $verdict, $((SECONDS - t0)) s: ${env[*]} $*"; grep -E "$pattern" "$out/$name.log" | head -60; } >> "$summary"
}
: > "$summary"
if [ "$part" = 1 ] || [ "$part" = all ]; then
  step moe_expert_test check 'worst row error|FAILED|Failure|PASSED' -- "$bin/moe_expert_test"
  step moe_expert_test-stream-direct check 'repacked=1|FAILED|Failure|PASSED' MOESHARD_MOE_STREAM_DIRECT=1 -- \
    "$bin/moe_expert_test"
  step gpu_repack_check check 'mean KL|PASS|FAIL' -- bash "$root/scripts/gpu_repack_check.sh" "$bin"
  for fmt in mxfp4 q8_0; do
    common=(--shape qwen30b --format "$fmt" --t 1,4,16,64 --skip-baseline --stages)
    step "bench_$fmt-stream" measure '^ *(uniform|zipf)|shape:|ceilings' -- "$bin/moe_expert_bench" "${common[@]}"
    step "bench_$fmt-stream-direct" measure '^ *(uniform|zipf)|shape:' MOESHARD_MOE_STREAM_DIRECT=1 -- \
      "$bin/moe_expert_bench" "${common[@]}"
    step "bench_$fmt-stored" measure '^ *(uniform|zipf)|shape:' -- "$bin/moe_expert_bench" "${common[@]}" --no-repack
  done
fi
if [ "$part" = 2 ] || [ "$part" = all ]; then
  model=(--arch qwen3_moe --preset full-layer --layers 48 --dense-format q8_0 --prompt-len 640 --decode-steps 16
    --streams 1,4,16,64)
  pattern='streams|decode|prefill|experts|attention|step'
  step bm_mxfp4-auto measure "$pattern" -- "$bin/moeshard" bench-model "${model[@]}" --expert-format mxfp4 \
    --expert-layout auto
  step bm_mxfp4-stream measure "$pattern" -- "$bin/moeshard" bench-model "${model[@]}" --expert-format mxfp4 \
    --expert-layout stream
  step bm_mxfp4-stream-direct measure "$pattern" MOESHARD_MOE_STREAM_DIRECT=1 -- "$bin/moeshard" bench-model \
    "${model[@]}" --expert-format mxfp4 --expert-layout stream
  step bm_q8_0-auto measure "$pattern" -- "$bin/moeshard" bench-model "${model[@]}" --expert-format q8_0 \
    --expert-layout auto
  step bm_q8_0-stream measure "$pattern" MOESHARD_MOE_STREAM_Q8=1 -- "$bin/moeshard" bench-model "${model[@]}" \
    --expert-format q8_0 --expert-layout stream
  step bm_q8_0-stream-direct measure "$pattern" MOESHARD_MOE_STREAM_Q8=1 MOESHARD_MOE_STREAM_DIRECT=1 -- \
    "$bin/moeshard" bench-model "${model[@]}" --expert-format q8_0 --expert-layout stream
  # Muse Spark, 8 full-width NVFP4 layers (repacked by default): the direct GEMV against the route.
  spark=(--arch muse_spark --preset full-layer --layers 8 --expert-format nvfp4 --prompt-len 4096 --decode-steps 32
    --streams 1,4)
  step bm_spark-nvfp4 measure "$pattern" -- "$bin/moeshard" bench-model "${spark[@]}"
  step bm_spark-nvfp4-stream-direct measure "$pattern" MOESHARD_MOE_STREAM_DIRECT=1 -- "$bin/moeshard" bench-model \
    "${spark[@]}"
fi
cat "$summary"
exit $failed
