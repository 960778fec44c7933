#!/usr/bin/env bash
# `moeshard check` passes on every testdata model and fails (non-zero) once a weight is
# perturbed. Usage: check_cli_test.sh path/to/moeshard small|big
# small: the tiny models, the flags, the refusals and the perturbed weights; big: the runs on the
# 15 MB qwen3moe-tok and its GGUF files (minutes under ASan: ctest cli_check_big, label long).
set -u
bin=$1
part=${2:-}
case $part in small | big) ;; *) echo "usage: $0 path/to/moeshard small|big" >&2; exit 2 ;; esac
td=${MOESHARD_TESTDATA:?set MOESHARD_TESTDATA to the assembled test models (ctest does)}
if [ ! -d "$td/qwen3moe-tiny" ]; then echo "FAIL: no test models at $td"; exit 1; fi
source "$(dirname "$0")/check_run.sh"
if [ "$part" = big ]; then
  run 0 "$td/qwen3moe-tok" "$td/qwen3moe-tok/goldens.safetensors"
  run 0 "$td/qwen3moe-tok/model-f16.gguf" "$td/qwen3moe-tok/goldens.safetensors"
  run 0 "$td/qwen3moe-tok/model-q8_0.gguf" "$td/qwen3moe-tok/goldens.safetensors"
  # The Q8_0 file against transformers on its own weights: the strict fp32 tolerance.
  repo_td="$(cd "$(dirname "$0")/../testdata" && pwd)"
  run 0 "$td/qwen3moe-tok/model-q8_0.gguf" "$repo_td/qwen3moe-tok-q8_0/goldens.safetensors" --tolerance fp32
  # ... and the unquantized goldens are not within the strict tolerance of the Q8_0 file.
  run 1 "$td/qwen3moe-tok/model-q8_0.gguf" "$td/qwen3moe-tok/goldens.safetensors" --tolerance fp32
  run 0 "$td/qwen3moe-tok" "$td/qwen3moe-tok/goldens.safetensors" --max-batch-tokens 16 --tp 2
  exit $fail
fi
for m in qwen3moe-tiny muse-spark-tiny muse-spark-tiny-nvfp4; do
  run 0 "$td/$m" "$td/$m/goldens.safetensors"
done
# In-process layouts on the CPU: tensor parallel (ranks as threads) and uneven layer split.
run 0 "$td/muse-spark-tiny" "$td/muse-spark-tiny/goldens.safetensors" --tp 2
run 0 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --layer-split 3
# Chunked prefill: the goldens' 100-token sequences and the greedy prompts in steps of 16 tokens.
run 0 "$td/muse-spark-tiny" "$td/muse-spark-tiny/goldens.safetensors" --max-batch-tokens 16
run 2 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --max-batch-tokens 0
# Bad layouts and backends are usage errors (exit 2) or clear failures (exit 1), never crashes.
run 1 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --tp 3
run 1 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --layer-split 99
run 2 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --dtype bfloat16
# A narrower KV cache than the CPU's float32 is refused with the reason, not silently ignored.
for kv in fp8 bfloat16; do
  run 2 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --kv-dtype $kv
  grep -q "keeps its KV cache in float32" "$check_out" || { echo "FAIL: --kv-dtype $kv on the CPU does not say why"; fail=1; }
done
run 0 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --kv-dtype float32
# The GPU's expert layouts mean nothing on the CPU: refused with the reason; an unknown one too.
run 2 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --expert-layout stream
grep -q "keeps experts as stored" "$check_out" || { echo "FAIL: --expert-layout stream on the CPU does not say why"; fail=1; }
run 2 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --expert-layout packed
grep -q "unknown expert layout 'packed'" "$check_out" || { echo "FAIL: an unknown --expert-layout is not named"; fail=1; }
run 0 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --expert-layout auto
run 2 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --device tpu
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  run 1 "$td/qwen3moe-tiny" "$td/qwen3moe-tiny/goldens.safetensors" --device cuda
  grep -q "CUDA" "$check_out" || { echo "FAIL: --device cuda without a GPU does not say why"; fail=1; }
fi
# Perturb 16 bytes in the middle of the weights of a copy: check must now fail (exit 1, a
# tolerance failure, not a load error).
for m in qwen3moe-tiny muse-spark-tiny-nvfp4; do
  tmp=$(mktemp -d)
  cp "$td/$m/config.json" "$td/$m/model.safetensors" "$tmp/"
  size=$(stat -c %s "$tmp/model.safetensors")
  printf '\x3f\x80\x3f\x80\x3f\x80\x3f\x80\x3f\x80\x3f\x80\x3f\x80\x3f\x80' |
    dd of="$tmp/model.safetensors" bs=1 seek=$((size / 2)) conv=notrunc status=none
  run 1 "$tmp" "$td/$m/goldens.safetensors"
  rm -rf "$tmp"
done
exit $fail
