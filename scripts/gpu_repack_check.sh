#!/usr/bin/env bash
# The worker's load-time repack of NVFP4 experts (worker/gpu/expert_repack.cc) on a checkpoint
# whose experts take the streaming kernels (expert width and intermediate multiples of 256):
# a make-model Muse Spark is evaluated on the CPU (fp32, the base), then on GPU 0 in bfloat16
# with the repack and without it (MOESHARD_MOE_REPACK=0, the previous kernels), and in float32.
# Passes when float32 matches the CPU (mean KL <= 1e-6) and the repacked bf16 run is as close
# to the CPU as the unrepacked one (mean KL within 1.5x + 1e-4 of it).
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
"$bin" make-model --arch muse_spark --preset small --nvfp4 --hidden 512 --latent 256 --intermediate 256 \
  --experts 16 --top-k 4 --layers 2 --seed 11 --out "$work/m" > /dev/null || exit 1
"$bin" eval --model "$work/m" --text "$text" --ctx 128 --max-windows 8 --save-logits "$work/cpu.mskl" > /dev/null || exit 1
device=${MOESHARD_CHECK_DEVICE:-cuda}  # cpu: only to test this script without a GPU
kl() {  # kl REPACK DTYPE: mean KL of a run against the CPU's logits
  local dt=(--dtype "$2")
  [ "$device" = cpu ] && dt=()
  MOESHARD_MOE_REPACK=$1 "$bin" eval --model "$work/m" --compare "$work/cpu.mskl" --device "$device" \
    "${dt[@]}" > "$work/out" 2>&1 || { cat "$work/out" >&2; return 1; }
  sed -n 's/^ *mean KLD *\([0-9.eE+-]*\).*/\1/p' "$work/out"
}
repack=$(kl 1 bfloat16) || exit 1
norepack=$(kl 0 bfloat16) || exit 1
fp32=$(kl 1 float32) || exit 1
echo "mean KL vs CPU fp32: bf16 repacked $repack, bf16 not repacked $norepack, float32 $fp32"
num='^[0-9.eE+-]+$'
if ! [[ $repack =~ $num && $norepack =~ $num && $fp32 =~ $num ]]; then
  echo "FAIL: no 'mean KLD' line in an eval report"; exit 1
fi
awk -v r="$repack" -v n="$norepack" -v f="$fp32" 'BEGIN {
  ok = (f <= 1e-6) && (r <= 1.5 * n + 1e-4);
  print ok ? "PASS" : "FAIL"; exit ok ? 0 : 1 }'
