#!/usr/bin/env bash
# Issue 13's decode switches against the defaults, in one GPU session: the GPU tests that cover them
# (model_ops_test's residual cases with MOESHARD_RESIDUAL_WIDE=0 and =1, gemv_test with MOESHARD_GEMV_SPLITK=0),
# then bench-model's decode on both shapes (Muse Spark 8 NVFP4 layers; Qwen3-30B MXFP4 experts in
# the stream layout, Q8_0 dense), each setting twice, alternating, at 1 and 4 streams.
#   bench/decode_ab.sh BIN_DIR [SETTING ...]
# BIN_DIR holds moeshard, model_ops_test and gemv_test (a device bundle's bin/).
# DECODE_AB_STREAMS: bench-model's --streams (default 1,4). A SETTING is a
# space-separated list of VAR=VALUE (default: the defaults, then each switch off alone — the wide
# gated residual update and the split GEMV, both off, and the direct GEMV's down kernel waiting
# before its first weights — all on by default since 2026-12-06).
set -uo pipefail
bin=${1:?usage: decode_ab.sh BIN_DIR [SETTING ...]}
shift
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=("X=0" "MOESHARD_RESIDUAL_WIDE=0" "MOESHARD_GEMV_SPLITK=0"
                                      "MOESHARD_RESIDUAL_WIDE=0 MOESHARD_GEMV_SPLITK=0" "MOESHARD_MOE_DOWN_EARLY=0")
export NCCL_NVLS_ENABLE=0
log() { echo "== $(date -u +%H:%M:%S) $*"; }
rc=0
for t in "model_ops_test MOESHARD_RESIDUAL_WIDE=1 GTEST_FILTER=*Residual*" \
  "model_ops_test MOESHARD_RESIDUAL_WIDE=0 GTEST_FILTER=*Residual*" "gemv_test MOESHARD_GEMV_SPLITK=0"; do
  read -r name vars <<< "$t"
  tlog="/tmp/decode_ab_${name}_$(echo "$vars" | tr -c 'A-Za-z0-9\n' '_').log"
  # shellcheck disable=SC2086  # the variables are words
  env $vars "$bin/$name" > "$tlog" 2>&1 || rc=1
  log "$name ($vars): $(grep -E '^\[  (PASSED|FAILED) ' "$tlog" | tr '\n' ' ')"
  grep -E 'Failure' -A3 "$tlog" | head -12
done
streams=${DECODE_AB_STREAMS:-1,4}
# shape_args SHAPE: bench-model's arguments for muse or qwen.
shape_args() {
  if [ "$1" = muse ]; then
    echo "--arch muse_spark --preset full-layer --layers 8 --expert-format nvfp4 --prompt-len 640 --decode-steps 16"
  else
    echo "--arch qwen3_moe --preset full-layer --layers 48 --expert-format mxfp4 --dense-format q8_0" \
      "--expert-layout stream --prompt-len 640 --decode-steps 32"
  fi
}
for rep in 1 2; do
  for s in "${settings[@]}"; do
    for shape in muse qwen; do
      # shellcheck disable=SC2086,SC2046  # the setting's and the shape's words
      line=$(env $s "$bin/moeshard" bench-model $(shape_args "$shape") --streams "$streams" 2>&1 |
        grep -E '^\| decode' | awk -F'|' '{gsub(/ +/, " "); printf "%s:%s ", $2, $4}')
      [ -n "$line" ] || rc=1
      log "rep $rep $shape [$s] $line"
    done
  done
done
exit $rc
