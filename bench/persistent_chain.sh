#!/usr/bin/env bash
# Issue 13's persistent-kernel hypothesis in one device call: bench/persistent_chain_bench (the
# dense part of a Qwen3-30B decode layer as the runner's three Gemv launches against one persistent
# launch; its own check against the production chain) at 1, 2 and 4 tokens, twice, around
# bench-model's decode step on the same shape (MXFP4 and Q8_0 experts, 1 and 4 streams), so the
# chain's figures sit beside the whole step's of the same machine; then bench/persistent_layer_bench
# (the layer without its attention — dense, routing, Q8_0 and MXFP4 experts — as one persistent launch,
# checked against a host reference) at 1 and 2 tokens, to set beside bench-model's Q8_0 step less its
# attention (the chain table's 9.85 µs a layer at one stream).
#   bench/persistent_chain.sh BIN_DIR OUT_DIR
#   (BIN_DIR: persistent_chain_bench, persistent_layer_bench and moeshard)
set -uo pipefail
bin=${1:?usage: persistent_chain.sh BIN_DIR OUT_DIR}
out=${2:?usage: persistent_chain.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
chain() {
  timeout 180 "$bin/persistent_chain_bench" --layers 48 --tokens 1,2,4 --iters 20 > "$out/chain-$1.txt" 2>&1
  echo "-- persistent_chain_bench run $1 (rc=$?)"
  cat "$out/chain-$1.txt"
}
chain 1
for f in mxfp4 q8_0; do
  timeout 180 "$bin/moeshard" bench-model --arch qwen3_moe --preset full-layer --layers 48 --dense-format q8_0 \
    --expert-layout stream --expert-format "$f" --prompt-len 640 --decode-steps 32 --streams 1,4 > "$out/bench-$f.log" 2>&1
  echo "-- bench-model $f (rc=$?)"
  grep -E '^\| decode|^model:' "$out/bench-$f.log"
done
chain 2
timeout 240 "$bin/persistent_layer_bench" --layers 48 --tokens 1,2 --iters 20 > "$out/layer.txt" 2>&1
echo "-- persistent_layer_bench (rc=$?)"
cat "$out/layer.txt"
