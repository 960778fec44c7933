#!/usr/bin/env bash
# The worker's load-time repack of experts for the streaming kernels (worker/gpu/expert_repack.cc)
# on checkpoints whose experts take them (expert width and intermediate multiples of 256):
#   NVFP4: a make-model Muse Spark, evaluated on the CPU (fp32, the base), then on GPU 0 in
#     bfloat16 with the repack (the default layout) and without it (MOESHARD_MOE_REPACK=0, the
#     previous kernels), and in float32;
#   MXFP4: a make-model Qwen3-MoE GGUF, the same with --expert-layout stream (repacked) against
#     the default layout (MXFP4 experts as stored, the GEMV kernels);
#   Q8_0: the same GGUF with Q8_0 experts, --expert-layout stream (the int8 streaming layout,
#     kernels/moe/moe_q8_stream.cu) against the default layout.
# Passes when each float32 run matches the CPU (mean KL <= 1e-6) and each repacked bf16 run is
# as close to the CPU as the unrepacked one (mean KL within 1.5x + 1e-4 of it).
#   scripts/gpu_repack_check.sh BIN_DIR [TEXT]
# Exits 77 without a GPU.
set -uo pipefail
bin=${1:?usage: gpu_repack_check.sh BIN_DIR [TEXT]}/moeshard
text=${2:-$(dirname "$0")/../tests/worker/data/genesis8.txt}
if [ "${MOESHARD_CHECK_DEVICE:-cuda}" = cuda ] && { ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; }; then
  echo "SKIPPED: no CUDA device"; exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
device=${MOESHARD_CHECK_DEVICE:-cuda}  # cpu: only to test this script without a GPU
kl() {  # kl MODEL REPACK DTYPE [LAYOUT]: mean KL of a run against the CPU's logits of MODEL
  local model=$1 dt=(--dtype "$3") layout=()
  [ -n "${4:-}" ] && layout=(--expert-layout "$4")
  [ "$device" = cpu ] && dt=() layout=()
  MOESHARD_MOE_REPACK=$2 "$bin" eval --model "$model" --compare "$work/cpu.mskl" --device "$device" \
    "${dt[@]}" "${layout[@]}" > "$work/out" 2>&1 || { cat "$work/out" >&2; return 1; }
  sed -n 's/^ *mean KLD *\([0-9.eE+-]*\).*/\1/p' "$work/out"
}
judge() {  # judge NAME REPACKED UNREPACKED FP32
  echo "$1: mean KL vs CPU fp32: bf16 repacked $2, bf16 not repacked $3, float32 $4"
  local num='^[0-9.eE+-]+$'
  if ! [[ $2 =~ $num && $3 =~ $num && $4 =~ $num ]]; then
    echo "FAIL: no 'mean KLD' line in an eval report"; return 1
  fi
  awk -v r="$2" -v n="$3" -v f="$4" -v name="$1" 'BEGIN {
    ok = (f <= 1e-6) && (r <= 1.5 * n + 1e-4);
    print (ok ? "PASS " : "FAIL ") name; exit ok ? 0 : 1 }'
}
base() {  # base MODEL: the CPU's logits
  "$bin" eval --model "$1" --text "$text" --ctx 128 --max-windows 8 --save-logits "$work/cpu.mskl" > /dev/null
}
fail=0
"$bin" make-model --arch muse_spark --preset small --nvfp4 --hidden 512 --latent 256 --intermediate 256 \
  --experts 16 --top-k 4 --layers 2 --seed 11 --out "$work/m" > /dev/null || exit 1
base "$work/m" || exit 1
repack=$(kl "$work/m" 1 bfloat16) || exit 1
norepack=$(kl "$work/m" 0 bfloat16) || exit 1
fp32=$(kl "$work/m" 1 float32) || exit 1
judge nvfp4 "$repack" "$norepack" "$fp32" || fail=1
"$bin" make-model --arch qwen3_moe --preset small --format gguf --expert-type mxfp4 --hidden 512 --intermediate 256 \
  --experts 16 --top-k 4 --layers 2 --seed 11 --out "$work/q.gguf" > /dev/null || exit 1
base "$work/q.gguf" || exit 1
repack=$(kl "$work/q.gguf" 1 bfloat16 stream) || exit 1
norepack=$(kl "$work/q.gguf" 1 bfloat16 auto) || exit 1
fp32=$(kl "$work/q.gguf" 1 float32) || exit 1
judge mxfp4 "$repack" "$norepack" "$fp32" || fail=1
"$bin" make-model --arch qwen3_moe --preset small --format gguf --expert-type q8_0 --hidden 512 --intermediate 256 \
  --experts 16 --top-k 4 --layers 2 --seed 11 --out "$work/q8.gguf" > /dev/null || exit 1
base "$work/q8.gguf" || exit 1
repack=$(kl "$work/q8.gguf" 1 bfloat16 stream) || exit 1
norepack=$(kl "$work/q8.gguf" 1 bfloat16 auto) || exit 1
fp32=$(kl "$work/q8.gguf" 1 float32) || exit 1
judge q8_0 "$repack" "$norepack" "$fp32" || fail=1
exit $fail
