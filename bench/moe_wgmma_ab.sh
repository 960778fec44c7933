#!/usr/bin/env bash
# The MoE wgmma prefill path's two weight feeds side by side (issue 14): the expansion pass
# (default) and the decoding producer (MOESHARD_MOE_WGMMA_DECODE=1), in one GPU session:
#   1. moe_expert_test through the decoding producer (its results against the CPU reference);
#   2. moe_expert_bench at the Qwen3-30B-A3B shape, each expert format, both feeds, and the
#      GEMV/mma kernels (MOESHARD_MOE_WGMMA=0) for scale;
#   3. bench-model's 4,096-token prefill, both feeds.
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
log "moe_expert_test, decoding producer"
MOESHARD_MOE_WGMMA_DECODE=1 "$bin/moe_expert_test" > /tmp/moe_wgmma_ab_test.log 2>&1 || rc=1
grep -E "wgmma=1|^\[  (FAILED|PASSED) |Failure" /tmp/moe_wgmma_ab_test.log | grep -vE " act=f32 " | tail -30
for f in mxfp4 q8_0 bf16; do
  for feed in expand decode gemv; do
    env=(MOESHARD_MOE_WGMMA_DECODE=0)
    [ $feed = decode ] && env=(MOESHARD_MOE_WGMMA_DECODE=1)
    [ $feed = gemv ] && env=(MOESHARD_MOE_WGMMA=0)
    log "moe_expert_bench --format $f, $feed"
    env "${env[@]}" "$bin/moe_expert_bench" --shape qwen30b --format "$f" --t "$ts" --routing uniform --skip-baseline \
      2>&1 | tail -n "$(( $(tr -cd , <<< "$ts" | wc -c) + 2 ))" || rc=1
  done
done
for feed in 0 1; do
  log "bench-model prefill 4096, MOESHARD_MOE_WGMMA_DECODE=$feed"
  MOESHARD_MOE_WGMMA_DECODE=$feed "$bin/moeshard" bench-model --arch qwen3_moe --preset full-layer --layers 48 \
    --expert-format mxfp4 --dense-format q8_0 --prompt-len 4096 --decode-steps 4 --streams 1 2>&1 |
    grep -E "^\| prefill|^  prefill:" || rc=1
done
exit $rc
