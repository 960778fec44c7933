#!/usr/bin/env bash
# The model-level GPU checks of the CUDA backend: `moeshard check` on every testdata model,
# on GPU 0, in bf16 (each model's row of ../shared/testdata/README.md's bf16 table) and in
# float32 (the strict fp32 tolerance, or Q8_0's for the Q8_0 file), each in one worker, layer
# split over 2 stages and tensor parallel over 2 ranks on the one GPU (host-staged all-reduce),
# and one worker with --max-batch-tokens 16 (chunked prefill: the GPU runner refuses a bigger step,
# so the goldens' 100-token sequences pass only in chunks).
#   scripts/gpu_check.sh BIN_DIR TESTDATA_DIR [model ...]
# Prints one line per run and `N passed, M failed`; exits 1 if any failed, 77 without a GPU.
set -uo pipefail
bin=${1:?usage: gpu_check.sh BIN_DIR TESTDATA_DIR [model ...]}/moeshard
data=${2:?usage: gpu_check.sh BIN_DIR TESTDATA_DIR [model ...]}
shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(muse-spark-tiny muse-spark-tiny-nvfp4 qwen3moe-tiny qwen3moe-tok
                                   qwen3moe-tok/model-f16.gguf qwen3moe-tok/model-q8_0.gguf)
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIPPED: no CUDA device"; exit 77
fi
# bf16 rows of the README's table: mean KL and top-1 (full-logit goldens); top-k goldens use
# top-1 >= 90 % and max lse diff <= 0.5 (check's defaults).
bf16_limits() {
  case "$1" in
    muse-spark-tiny) echo "--bf16-mean-kl 2e-2 --bf16-top1 0.88" ;;
    muse-spark-tiny-nvfp4) echo "--bf16-mean-kl 1e-2 --bf16-top1 0.88" ;;
    qwen3moe-tiny) echo "--bf16-mean-kl 5e-3 --bf16-top1 0.90" ;;
    *) echo "" ;;
  esac
}
pass=0 fail=0
for m in "${models[@]}"; do
  path="$data/$m"
  dir=$path; [ -f "$path" ] && dir=$(dirname "$path")
  [ -e "$path" ] || { echo "MISSING $path"; fail=$((fail + 1)); continue; }
  for dtype in bfloat16 float32; do
    for layout in "" "--layer-split 2" "--tp 2" "--max-batch-tokens 16"; do
      extra=""; [ "$dtype" = bfloat16 ] && extra=$(bf16_limits "$m")
      # shellcheck disable=SC2086
      out=$("$bin" check --model "$path" --goldens "$dir/goldens.safetensors" --device cuda --dtype $dtype $layout $extra 2>&1)
      rc=$?
      # bf16: the pooled figures; fp32/q8_0: the largest per-sequence errors.
      summary=$(echo "$out" | awk '/^pooled/ {printf "%s; ", $0}
        /^seq/ {for (i = 1; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == "max_err" && kv[2] + 0 > me) me = kv[2] + 0;
                 if (kv[1] == "lse_err" && kv[2] + 0 > le) le = kv[2] + 0 } }
        /greedy/ {g = g $1 " " $3 " "}
        END {if (me != "") printf "max_err %.3g lse_err %.3g; ", me, le; printf "%s", g}' | sed 's/  */ /g')
      if [ $rc -eq 0 ]; then pass=$((pass + 1)); verdict=PASS; else fail=$((fail + 1)); verdict=FAIL; fi
      echo "$verdict $m $dtype ${layout:-single} :: $(echo "$out" | head -1) :: $summary"
      [ $rc -eq 0 ] || echo "$out" | tail -25
    done
  done
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
