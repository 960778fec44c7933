#!/usr/bin/env bash
# `moeshard eval` on the bundled demo model with held-out text (Genesis 8, a validation
# chapter of the demo's KJV split): single worker, tensor parallel (--tp 2) and layer split
# (--layer-split 2) must give the same perplexity (4 significant digits), mean KL < 1e-6
# and 100 % top-1 agreement; the perplexity must be finite and below 200 (a sanity bound on
# one chapter scored llama-perplexity's way; demo_model_kl_test holds the model card's
# validation perplexity to 1 %). The same run saved in llama.cpp's --kl-divergence-base layout (*.kld) must have
# its header and size, compare within its uint16 quantization (|mean KL| < 1e-4, top-1
# >= 99 %), evaluate its own tokens without --text and write itself back byte for byte.
# A llama.cpp file built here by hand with another vocabulary is refused. Error cases exit
# 1. Usage: eval_cli_test.sh path/to/moeshard path/to/repo
set -u
bin=$1
root=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
model=$root/models/muse-spark-demo
text=$root/tests/worker/data/genesis8.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ppl() { sed -n 's/^perplexity: \([^ ]*\) over.*/\1/p' "$1"; }
# check_compare NAME OUT MAX_ABS_MEAN_KL MIN_TOP1: the `compare:` line of an eval output.
check_compare() {
  local line kl top1
  line=$(grep '^compare:' "$2")
  echo "$1: $line"
  kl=$(echo "$line" | sed -n 's/.*mean \([^ ]*\) max.*/\1/p')
  top1=$(echo "$line" | sed -n 's/.*agreement \([^ ]*\) %.*/\1/p')
  if ! awk -v k="$kl" -v m="$3" 'BEGIN { exit !(k != "" && (k < 0 ? -k : k) + 0 < m + 0) }'; then echo "FAIL: $1 mean KL '$kl'"; fail=1; fi
  if ! awk -v t="$top1" -v m="$4" 'BEGIN { exit !(t != "" && t + 0 >= m + 0) }'; then echo "FAIL: $1 top-1 agreement '$top1'"; fail=1; fi
}

"$bin" eval --model "$model" --text "$text" --save-logits "$tmp/base.mskl" > "$tmp/base.out" 2> "$tmp/base.err"
if [ $? -ne 0 ]; then echo "FAIL: single-worker eval"; cat "$tmp/base.out" "$tmp/base.err"; exit 1; fi
cat "$tmp/base.out"
base=$(ppl "$tmp/base.out")
if ! awk -v p="$base" 'BEGIN { exit !(p != "" && p + 0 > 1 && p + 0 < 200) }'; then
  echo "FAIL: perplexity '$base' is not finite and below 200"; fail=1
fi
grep -q '^\[1/' "$tmp/base.err" || { echo "FAIL: no progress line on stderr"; fail=1; }

for mode in "--tp 2" "--layer-split 2"; do
  # shellcheck disable=SC2086
  "$bin" eval --model "$model" --text "$text" $mode --compare "$tmp/base.mskl" > "$tmp/cmp.out" 2> "$tmp/cmp.err"
  if [ $? -ne 0 ]; then echo "FAIL: eval $mode"; cat "$tmp/cmp.out" "$tmp/cmp.err"; fail=1; continue; fi
  got=$(ppl "$tmp/cmp.out")
  if [ "$(printf '%.4g' "$got")" != "$(printf '%.4g' "$base")" ]; then echo "FAIL: $mode perplexity $got != $base"; fail=1; fi
  check_compare "$mode vs mskl" "$tmp/cmp.out" 1e-6 100
done

# Chunked prefill: windows of 128 tokens in steps of 40 (and 1 worker and --layer-split 2) write
# the single step's MSKL file byte for byte (float32 on the CPU: the same arithmetic per row).
for mode in "" "--layer-split 2"; do
  # shellcheck disable=SC2086
  if ! "$bin" eval --model "$model" --text "$text" $mode --max-batch-tokens 40 --save-logits "$tmp/chunked.mskl" > "$tmp/chunked.out" 2>&1; then
    echo "FAIL: eval $mode --max-batch-tokens 40"; cat "$tmp/chunked.out"; fail=1
  elif [ -n "$mode" ]; then
    "$bin" eval --model "$model" --text "$text" $mode --save-logits "$tmp/whole.mskl" > /dev/null 2>&1
    if cmp -s "$tmp/whole.mskl" "$tmp/chunked.mskl"; then echo "ok: eval $mode in steps of 40 = one step, byte for byte"
    else echo "FAIL: eval $mode in steps of 40 differs from one step"; fail=1; fi
  elif cmp -s "$tmp/base.mskl" "$tmp/chunked.mskl"; then echo "ok: eval in steps of 40 = one step, byte for byte"
  else echo "FAIL: eval in steps of 40 differs from one step"; fail=1; fi
done

# llama.cpp's layout: the single-worker run again, saved as base.kld (llama by its extension).
"$bin" eval --model "$model" --text "$text" --save-logits "$tmp/base.kld" > /dev/null 2>&1 || { echo "FAIL: saving base.kld"; fail=1; }
# "_logits_", int32 n_ctx 128, n_vocab 4096, n_chunk 5, 5 x 128 int32 ids, then 5 x 63 rows of
# 2*((4096+1)/2)+4 = 4100 uint16.
magic=$(head -c 8 "$tmp/base.kld")
hdr=$(od -An -t d4 -j 8 -N 12 "$tmp/base.kld" | tr -s ' ' | sed 's/^ //')
size=$(wc -c < "$tmp/base.kld")
if [ "$magic" != "_logits_" ] || [ "$hdr" != "128 4096 5" ] || [ "$size" -ne $((20 + 5 * 128 * 4 + 5 * 63 * 4100 * 2)) ]; then
  echo "FAIL: base.kld header '$magic' '$hdr', $size bytes"; fail=1
else echo "ok: base.kld header $magic n_ctx/n_vocab/n_chunk $hdr, $size bytes"; fi
# Layer split against the llama file, saving its own run in MSKL: the other layout both ways.
"$bin" eval --model "$model" --text "$text" --layer-split 2 --compare "$tmp/base.kld" --save-logits "$tmp/split.bin" \
  --logits-format mskl > "$tmp/cmp.out" 2> "$tmp/cmp.err" || { echo "FAIL: layer split vs base.kld"; cat "$tmp/cmp.err"; fail=1; }
check_compare "--layer-split 2 vs llama" "$tmp/cmp.out" 1e-4 99
grep -q 'same top p' "$tmp/cmp.out" || { echo "FAIL: no llama-perplexity figures"; fail=1; }
[ "$(head -c 4 "$tmp/split.bin")" = "MSKL" ] || { echo "FAIL: --logits-format mskl did not write MSKL"; fail=1; }
"$bin" eval --model "$model" --text "$text" --tp 2 --compare "$tmp/split.bin" > "$tmp/cmp.out" 2>&1 || { echo "FAIL: tp vs split.bin"; fail=1; }
check_compare "--tp 2 vs layer split (mskl)" "$tmp/cmp.out" 1e-6 100
# Without --text the file's own tokens are evaluated; saving that run again gives the same bytes.
"$bin" eval --model "$model" --compare "$tmp/base.kld" --save-logits "$tmp/again.kld" > "$tmp/cmp.out" 2>&1 || { echo "FAIL: eval of the file's own tokens"; cat "$tmp/cmp.out"; fail=1; }
[ "$(ppl "$tmp/cmp.out")" = "$base" ] || { echo "FAIL: the file's own tokens give perplexity $(ppl "$tmp/cmp.out"), not $base"; fail=1; }
if cmp -s "$tmp/base.kld" "$tmp/again.kld"; then echo "ok: base.kld read and written back byte for byte"; else echo "FAIL: base.kld round trip differs"; fail=1; fi

expect_err() {  # description, then the eval arguments; must exit 1 with a message
  local what=$1; shift
  "$bin" eval "$@" > "$tmp/e.out" 2>&1
  rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q '^eval: ' "$tmp/e.out"; then echo "FAIL: $what exited $rc"; cat "$tmp/e.out"; fail=1
  else echo "ok: $what -> $(head -n1 "$tmp/e.out")"; fi
}
expect_err "missing text" --model "$model" --text "$tmp/nope.txt"
printf 'In the beginning' > "$tmp/short.txt"
expect_err "short text" --model "$model" --text "$tmp/short.txt"
# A base file whose vocab field is wrong (bytes 8..11 of the header): its size gives it away.
cp "$tmp/base.mskl" "$tmp/badvocab.mskl"
printf '\x01\x00\x00\x00' | dd of="$tmp/badvocab.mskl" bs=1 seek=8 conv=notrunc status=none
expect_err "corrupt header" --model "$model" --text "$text" --compare "$tmp/badvocab.mskl"
# A well-formed llama.cpp file by hand: n_ctx 4, n_vocab 3, 1 chunk, ids 0 1 2 1, one row of
# 2*((3+1)/2)+4 = 8 uint16 (scale 0.25, min_log_prob -4, q 0 8 16, padding).
{ printf '_logits_\x04\x00\x00\x00\x03\x00\x00\x00\x01\x00\x00\x00'
  printf '\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00'
  printf '\x00\x00\x80\x3e\x00\x00\x80\xc0\x00\x00\x08\x00\x10\x00\x00\x00'; } > "$tmp/vocab3.kld"
expect_err "vocab mismatch" --model "$model" --compare "$tmp/vocab3.kld"
grep -q 'vocab mismatch: --compare file has 3' "$tmp/e.out" || { echo "FAIL: vocab3.kld not read as vocab 3"; fail=1; }
expect_err "unknown --logits-format" --model "$model" --text "$text" --save-logits "$tmp/x" --logits-format gguf
expect_err "missing compare file" --model "$model" --text "$text" --compare "$tmp/nope.mskl"

[ $fail -eq 0 ] && echo PASS || echo FAIL
exit $fail
