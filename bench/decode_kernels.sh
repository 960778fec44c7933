#!/usr/bin/env bash
# Each decode kernel's time and DRAM bytes for issue 13's two shapes (2 layers, one stream) under
# ncu, the launches one after another with the L2 kept warm, printed by bench/ncu_kernels.py: which
# kernels stream below the copy rate and which small ones hold the chain. Extra environment settings
# (e.g. MOESHARD_RESIDUAL_WIDE=1) pass through to moeshard.
#   bench/decode_kernels.sh BIN_DIR [OUT_DIR]
# BIN_DIR holds moeshard (a device bundle's bin/); ncu on the PATH. Writes OUT_DIR/{muse,qwen}_ncu.csv.
set -uo pipefail
bin=${1:?usage: decode_kernels.sh BIN_DIR [OUT_DIR]}
out=${2:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
command -v ncu > /dev/null || { echo "decode_kernels: ncu is not on the PATH" >&2; exit 1; }
export NCCL_NVLS_ENABLE=0
metric_names=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
metrics=(--cache-control none --clock-control none --metrics "$metric_names" --csv)
common=(bench-model --preset full-layer --layers 2 --prompt-len 32 --decode-steps 2 --streams 1)
rc=0
# The last 17 launches: Muse Spark's last layer, its final norm and the LM head; Qwen3's 12.
echo "== Muse Spark (8,192 wide, NVFP4 experts, bf16 dense)"
ncu "${metrics[@]}" "$bin/moeshard" "${common[@]}" --arch muse_spark --expert-format nvfp4 > "$out/muse_ncu.csv" 2>&1 || rc=1
python3 "$here/ncu_kernels.py" "$out/muse_ncu.csv" --last 17 || rc=1
echo "== Qwen3-30B (2,048 wide, MXFP4 experts in the stream layout, Q8_0 dense)"
ncu "${metrics[@]}" "$bin/moeshard" "${common[@]}" --arch qwen3_moe --expert-format mxfp4 --dense-format q8_0 \
  --expert-layout stream > "$out/qwen_ncu.csv" 2>&1 || rc=1
python3 "$here/ncu_kernels.py" "$out/qwen_ncu.csv" --last 12 || rc=1
exit $rc
