#!/usr/bin/env bash
# What each decode op costs inside the step's kernel chain (issue 13): bench-model once as is,
# then once per op with MOESHARD_REPEAT_OPS=op (the GPU runner launches that op twice a step;
# each is idempotent), and the difference per layer — PDL's overlap, launch and tail included,
# which a kernel timed alone (ncu) does not show. An upper bound for small kernels: a second
# copy waits for the first, where the one in the chain overlaps its neighbours.
#   bench/decode_chain.sh BIN_DIR [bench-model args...]
# Default args: the Qwen3-30B-A3B shape (MXFP4 experts, Q8_0 dense), 48 layers, 640 context,
# 1 and 4 streams. Prints a markdown table: ms a step per op and stream count, and µs a layer.
set -uo pipefail
bin=${1:?usage: decode_chain.sh BIN_DIR [bench-model args...]}
shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--arch qwen3_moe --preset full-layer --layers 48 --expert-format mxfp4
                                --dense-format q8_0 --prompt-len 640 --decode-steps 32 --streams 1,4)
layers=48
for ((i = 0; i < ${#args[@]}; ++i)); do [ "${args[i]}" = --layers ] && layers=${args[i + 1]}; done
export NCCL_NVLS_ENABLE=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ops=(none qkv attention o router routing experts lmhead)
for op in "${ops[@]}"; do
  if [ "$op" = none ]; then
    "$bin/moeshard" bench-model "${args[@]}" > "$tmp/$op.txt" 2>&1
  else
    MOESHARD_REPEAT_OPS=$op "$bin/moeshard" bench-model "${args[@]}" > "$tmp/$op.txt" 2>&1
  fi || { echo "decode_chain: bench-model failed for $op:" >&2; tail -3 "$tmp/$op.txt" >&2; exit 1; }
done
python3 "$(dirname "$0")/decode_chain_table.py" "$tmp" "$layers" "${ops[@]}"
