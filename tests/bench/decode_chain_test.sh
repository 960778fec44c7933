#!/usr/bin/env bash
# bench/decode_chain.sh against a stub `moeshard` whose bench-model step time depends on
# MOESHARD_REPEAT_OPS: every op's row, the differences in µs a layer (48 layers) and the LM
# head's in µs a step; a failing bench-model stops it with the stub's message.
set -euo pipefail
root=${1:?usage: decode_chain_test.sh SOURCE_DIR}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/moeshard" <<'STUB'
#!/usr/bin/env bash
case "${MOESHARD_REPEAT_OPS:-}" in
  "") a=3.00 b=6.00 ;;
  experts) a=4.20 b=9.84 ;;
  routing) [ -n "${STUB_FAIL:-}" ] && { echo "bench-model: no device"; exit 1; }; a=3.00 b=6.00 ;;
  *) a=3.24 b=6.48 ;;
esac
echo "| decode, 1 stream | 1 per step | $a ms / step | 1 | - | - |"
echo "| decode, 4 streams | 4 per step | $b ms / step | 1 | - | - |"
STUB
chmod +x "$d/moeshard"
bash "$root/bench/decode_chain.sh" "$d" > "$d/t"
cat "$d/t"
grep -qx '| none | 3.00 |  | 6.00 |  |' "$d/t"
grep -qx '| experts | 4.20 | 25.0 | 9.84 | 80.0 |' "$d/t"
grep -qx '| qkv | 3.24 | 5.0 | 6.48 | 10.0 |' "$d/t"
grep -qx '| routing | 3.00 | 0.0 | 6.00 | 0.0 |' "$d/t"
grep -qx '| lmhead | 3.24 | 240 a step | 6.48 | 480 a step |' "$d/t"
test "$(grep -c '^| ' "$d/t")" = 9  # the header and eight ops
if STUB_FAIL=1 bash "$root/bench/decode_chain.sh" "$d" > "$d/t2" 2> "$d/e2"; then
  echo "a failing bench-model must fail the table" >&2
  exit 1
fi
grep -q 'no device' "$d/e2"
echo "decode_chain_table: ok"
