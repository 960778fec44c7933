#!/usr/bin/env bash
# The decode path on the GPU machine in one call: the kernel op tests, bench-model on the
# Qwen3-30B-A3B shape (MXFP4 experts, Q8_0 dense, 4K context) and on 8 full-width Muse Spark
# NVFP4 layers with every decode fusion on and with all of them off (the same binary), each of
# the later switches (PDL, the register residual, the MoE combine in the residual) off alone, and
# an ncu table of one decode step's kernels (4 layers, warm caches; durations only, clocks left
# alone).
#   bench/decode_device.sh BIN_DIR OUT_DIR [quick]
# Prints the tables; full logs under OUT_DIR.
set -uo pipefail
bin=${1:?usage: decode_device.sh BIN_DIR OUT_DIR}
out=${2:?usage: decode_device.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
off=(MOESHARD_GEMV=0 MOESHARD_QK_PREP=0 MOESHARD_FUSE_NORMS=0 MOESHARD_DENSE_Q8=0)
qwen=(--arch qwen3_moe --preset full-layer --layers 48 --expert-format mxfp4 --prompt-len 4096 --decode-steps 32)
muse=(--arch muse_spark --preset full-layer --layers 8 --expert-format nvfp4 --prompt-len 4096 --decode-steps 32)

echo "== op tests"
for t in gemv_test qk_prep_test model_ops_test moe_expert_test op_harness_test; do
  [ -x "$bin/$t" ] || { echo "MISSING $t"; continue; }
  "$bin/$t" > "$out/$t.log" 2>&1
  echo "$t: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/$t.log" | head -5
done
[ "${3:-}" = quick ] && exit 0

bench() {  # NAME ENV... -- ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$bin/moeshard" bench-model "$@" > "$out/bench-$name.log" 2>&1
  echo "-- $name (rc=$?)"
  grep -E '^\| (prefill|decode)|^model:|^  decode 1' "$out/bench-$name.log"
}
echo "== bench-model"
bench qwen-mxfp4-new X=1 -- "${qwen[@]}" --dense-format q8_0 --streams 1,4
bench qwen-mxfp4-old "${off[@]}" -- "${qwen[@]}" --dense-format q8_0 --streams 1,4
bench qwen-q8-new X=1 -- "${qwen[@]/mxfp4/q8_0}" --dense-format q8_0 --streams 1,4
bench muse-new X=1 -- "${muse[@]}" --dense-format bf16 --streams 1,4
bench muse-old "${off[@]}" -- "${muse[@]}" --dense-format bf16 --streams 1,4
# This session's switches, one at a time (docs/PERFORMANCE.md "Fifth session"), and the
# harness's context (512 + 128).
bench qwen-mxfp4-nopdl MOESHARD_PDL=0 -- "${qwen[@]}" --dense-format q8_0 --streams 1,4
bench qwen-mxfp4-loopres MOESHARD_RESIDUAL_REG=0 -- "${qwen[@]}" --dense-format q8_0 --streams 1,4
bench qwen-mxfp4-moecombine MOESHARD_FUSE_MOE_RESIDUAL=0 -- "${qwen[@]}" --dense-format q8_0 --streams 1,4
bench qwen-mxfp4-640 X=1 -- "${qwen[@]/4096/640}" --dense-format q8_0 --streams 1,4

echo "== ncu: one decode step, 4 layers"
if command -v ncu > /dev/null; then
  # Caches left warm (--cache-control none): a cold-cache run reads small kernels 2-3 us high.
  ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
    "$bin/moeshard" bench-model --arch qwen3_moe --preset full-layer --layers 4 --expert-format mxfp4 \
    --dense-format q8_0 --prompt-len 4096 --decode-steps 4 --streams 1 > "$out/ncu-run.log" 2>&1
  python3 - "$out/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, ni, vi = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value")
ks = [(r[ki], float(r[vi].replace(",", ""))) for r in rows if r[ni] == "gpu__time_duration.sum"]
emb = [i for i, (k, _) in enumerate(ks) if "Embed" in k]
step = ks[emb[-2]:emb[-1]] if len(emb) >= 2 else ks
tot = sum(v for _, v in step)
print(f"kernels in one decode step: {len(step)}, sum of durations {tot/1e3:.1f} us (4 layers)")
agg = collections.OrderedDict()
for k, v in step:
    short = k.replace("void ", "").replace("(anonymous namespace)::", "").replace("moeshard::gpu::", "")
    short = short.split("<")[0].split("(")[0].strip()[:60]
    a = agg.setdefault(short, [0, 0.0]); a[0] += 1; a[1] += v
for k, (n, v) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"  {v/1e3:8.1f} us  {n:3d}x  {k}")
PY
else
  echo "no ncu"
fi
