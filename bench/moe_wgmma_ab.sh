#!/usr/bin/env bash
# The MoE wgmma prefill path's weight-tile widths side by side (issue 14), in one GPU session:
#   1. moe_expert_test (its wgmma cases take 256-row weight tiles where L and I allow, 128-row
#      ones where they do not);
#   2. moe_expert_bench at the Qwen3-30B-A3B shape, each expert format: 256-row tiles (default),
#      128-row tiles (MOESHARD_MOE_WGMMA_TN=128) and the GEMV/mma kernels (MOESHARD_MOE_WGMMA=0)
#      for scale;
#   3. bench-model's 4,096-token prefill, both widths;
#   4. with NCU=1 and ncu on the PATH: each kernel of one T = 4,096 MXFP4 step, both widths
#      (duration, SM and memory throughput, tensor-pipe use).
#   bench/moe_wgmma_ab.sh BIN_DIR [T list, default 1024,2048,4096,8192]
# BIN_DIR holds moe_expert_test, moe_expert_bench and moeshard (a device bundle's bin/).
set -uo pipefail
bin=${1:?usage: moe_wgmma_ab.sh BIN_DIR [T list]}
ts=${2:-1024,2048,4096,8192}
[[ $ts =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "moe_wgmma_ab: T list like 1024,4096 (got '$ts')" >&2; exit 2; }
for p in moe_expert_test moe_expert_bench moeshard; do
  [ -x "$bin/$p" ] || { echo "moe_wgmma_ab: no $bin/$p" >&2; exit 2; }
done
export NCCL_NVLS_ENABLE=0
log() { echo "== $(date -u +%H:%M:%S) $*"; }
rc=0
log "moe_expert_test"
"$bin/moe_expert_test" > /tmp/moe_wgmma_ab_test.log 2>&1 || rc=1
grep -E "wgmma=1|^\[  (FAILED|PASSED) |Failure" /tmp/moe_wgmma_ab_test.log | grep -vE " act=f32 " | tail -30
rows=$(( $(tr -cd , <<< "$ts" | wc -c) + 2 ))
for f in mxfp4 q8_0 bf16; do
  for tiles in 256 128 gemv; do
    env=(MOESHARD_MOE_WGMMA_TN=$tiles)
    [ $tiles = gemv ] && env=(MOESHARD_MOE_WGMMA=0)
    log "moe_expert_bench --format $f, ${env[*]}"
    env "${env[@]}" "$bin/moe_expert_bench" --shape qwen30b --format "$f" --t "$ts" --routing uniform --skip-baseline \
      2>&1 | tail -n "$rows" || rc=1
  done
done
for tiles in 256 128; do
  log "bench-model prefill 4096, MOESHARD_MOE_WGMMA_TN=$tiles"
  MOESHARD_MOE_WGMMA_TN=$tiles "$bin/moeshard" bench-model --arch qwen3_moe --preset full-layer --layers 48 \
    --expert-format mxfp4 --dense-format q8_0 --prompt-len 4096 --decode-steps 4 --streams 1 2>&1 |
    grep -E "^\| prefill|^  prefill:" || rc=1
done
if [[ ${NCU:-0} == 1 ]] && command -v ncu > /dev/null; then
  for tiles in 256 128; do
    log "ncu, one T = 4096 MXFP4 step, MOESHARD_MOE_WGMMA_TN=$tiles"
    MOESHARD_MOE_WGMMA_TN=$tiles ncu --clock-control none -k regex:'Wgmma|Expand|Gather|Combine|Route|Moe' -c 12 \
      --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__bytes.sum.per_second \
      "$bin/moe_expert_bench" --shape qwen30b --format mxfp4 --t 4096 --routing uniform --skip-baseline --iters 1 2>&1 |
      grep -E "^  [A-Za-z_].*\(|duration|throughput|gmma|per_second" | sed -E 's/ +/ /g' | cut -c1-160 | head -80
  done
fi
exit $rc
