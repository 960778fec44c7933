#!/usr/bin/env bash
# The MLP block's residual update inside the experts' down kernel (MOESHARD_FOLD_MOE_RESIDUAL=1,
# kernels/moe/moe_stream_direct_res.cu) against the residual kernel, in one GPU session: its tests
# (gemv_test's residual folds; moe_expert_test at the defaults and with MOESHARD_MOE_DOWN_RESIDUAL=0),
# a one-token-a-step `moeshard eval` with the fold on against the same run off (the same bits: mean
# KL 0 is required), then bench-model's one-stream decode step of the Qwen3-30B shape with both
# settings, alternated twice, MXFP4 and Q8_0 experts.
#   bench/moe_residual_fold.sh BIN_DIR
# BIN_DIR holds moeshard, gemv_test and moe_expert_test (a device bundle's bin/). Exits non-zero when a
# test fails or the fold changes a logit.
set -uo pipefail
bin=${1:?usage: moe_residual_fold.sh BIN_DIR}
text=$(dirname "$0")/../tests/worker/data/genesis8.txt
export NCCL_NVLS_ENABLE=0
log() { echo "== $(date -u +%H:%M:%S) $*"; }
rc=0
for t in "gemv_test GTEST_FILTER=*Residual*" "moe_expert_test X=0" "moe_expert_test MOESHARD_MOE_DOWN_RESIDUAL=0"; do
  read -r name vars <<< "$t"
  tlog="/tmp/fold_${name}_$(echo "$vars" | tr -c 'A-Za-z0-9\n' '_').log"
  # shellcheck disable=SC2086  # the variables are words
  env $vars "$bin/$name" > "$tlog" 2>&1 || rc=1
  log "$name ($vars): $(grep -E '^\[  (PASSED|FAILED) ' "$tlog" | tr '\n' ' ')"
  grep -E 'Failure' -A3 "$tlog" | head -12
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for et in mxfp4 q8_0; do
  "$bin/moeshard" make-model --arch qwen3_moe --preset small --format gguf --expert-type "$et" --hidden 512 \
    --intermediate 256 --experts 16 --top-k 4 --layers 3 --seed 11 --out "$work/$et.gguf" > /dev/null || rc=1
  for f in 0 1; do
    logits=(--save-logits "$work/$et.mskl")
    [ "$f" = 1 ] && logits=(--compare "$work/$et.mskl")
    MOESHARD_FOLD_MOE_RESIDUAL=$f "$bin/moeshard" eval --model "$work/$et.gguf" --text "$text" --ctx 64 --max-windows 2 \
      --device cuda --dtype bfloat16 --expert-layout stream --max-batch-tokens 1 "${logits[@]}" > "$work/eval$f" 2>&1 ||
      { rc=1; tail -5 "$work/eval$f"; }
  done
  line=$(grep -E '^compare:' "$work/eval1")
  log "eval $et, the fold against the residual kernel: $line"
  [[ $line == *"mean 0 max 0"* ]] || { echo "FAIL: the fold changed the logits"; rc=1; }
done
for rep in 1 2; do
  for et in mxfp4 q8_0; do
    for f in 0 1; do
      out=$(MOESHARD_FOLD_MOE_RESIDUAL=$f "$bin/moeshard" bench-model --arch qwen3_moe --preset full-layer --layers 48 \
        --dense-format q8_0 --expert-layout stream --expert-format "$et" --prompt-len 640 --decode-steps 32 --streams 1 2>&1)
      step=$(grep -E '^\| decode' <<< "$out" | awk -F'|' '{gsub(/ +/, " "); printf "%s:%s", $2, $4}')
      [ -n "$step" ] || rc=1
      log "rep $rep $et fold=$f $step; $(grep -E '^Expert steps' <<< "$out")"
    done
  done
done
exit $rc
