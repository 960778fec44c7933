#!/usr/bin/env bash
# `moeshard eval` on the bundled demo model with held-out text (Genesis 8, a validation
# chapter of the demo's KJV split): single worker, tensor parallel (--tp 2) and layer split
# (--layer-split 2) must give the same perplexity (4 significant digits), mean KL < 1e-6
# and 100 % top-1 agreement; the perplexity must be finite and below 200 (model card: val
# ppl ~34). Error cases exit 1. Usage: eval_cli_test.sh path/to/moeshard path/to/repo
set -u
bin=$1
root=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
model=$root/models/muse-spark-demo
text=$root/tests/worker/data/genesis8.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ppl() { sed -n 's/^perplexity: \([^ ]*\) over.*/\1/p' "$1"; }

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
  echo "$mode: $(tail -n1 "$tmp/cmp.out")"
  got=$(ppl "$tmp/cmp.out")
  line=$(grep '^compare:' "$tmp/cmp.out")
  kl=$(echo "$line" | sed -n 's/.*mean \([^ ]*\) max.*/\1/p')
  top1=$(echo "$line" | sed -n 's/.*agreement \([^ ]*\) %.*/\1/p')
  if [ "$(printf '%.4g' "$got")" != "$(printf '%.4g' "$base")" ]; then echo "FAIL: $mode perplexity $got != $base"; fail=1; fi
  if ! awk -v k="$kl" 'BEGIN { exit !(k != "" && k + 0 < 1e-6) }'; then echo "FAIL: $mode mean KL '$kl'"; fail=1; fi
  if [ "$top1" != "100.00" ]; then echo "FAIL: $mode top-1 agreement '$top1'"; fail=1; fi
done

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
# A base file whose vocab field is wrong (bytes 8..11 of the header).
cp "$tmp/base.mskl" "$tmp/badvocab.mskl"
printf '\x01\x00\x00\x00' | dd of="$tmp/badvocab.mskl" bs=1 seek=8 conv=notrunc status=none
expect_err "vocab mismatch" --model "$model" --text "$text" --compare "$tmp/badvocab.mskl"
expect_err "missing compare file" --model "$model" --text "$text" --compare "$tmp/nope.mskl"

[ $fail -eq 0 ] && echo PASS || echo FAIL
exit $fail
