#!/usr/bin/env bash
# bench/ncu_kernels.py on an ncu-format CSV (the metric rows of two launches, ncu's own unit
# scaling: ns / us and byte / Kbyte / Mbyte, thousands separators): each launch's µs, MB and GB/s,
# the last-N selection and the sum; a file that is not ncu's CSV fails with a message.
set -euo pipefail
root=${1:?usage: ncu_kernels_test.sh SOURCE_DIR}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
{
  echo '==PROF== Connected to process 1'
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  echo '"0","1","m","h","EmbedKernel","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","512"'
  echo '"0","1","m","h","EmbedKernel","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","0"'
  echo '"0","1","m","h","EmbedKernel","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","2,000"'
  echo '"1","1","m","h","void GemvKernel<1, 1, 2>(GemvLaunch)","1","7","(256, 1, 1)","(640, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","150.00"'
  echo '"1","1","m","h","void GemvKernel<1, 1, 2>(GemvLaunch)","1","7","(256, 1, 1)","(640, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Kbyte","10"'
  echo '"1","1","m","h","void GemvKernel<1, 1, 2>(GemvLaunch)","1","7","(256, 1, 1)","(640, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","50.00"'
} > "$d/run.csv"
python3 "$root/bench/ncu_kernels.py" "$d/run.csv" > "$d/all"
python3 "$root/bench/ncu_kernels.py" "$d/run.csv" --last 1 > "$d/one"
cat "$d/all"
grep -Eq '^ +2\.00 +0\.00 +0 +\(1, 1, 1\)  EmbedKernel$' "$d/all"
grep -Eq '^ +50\.00 +150\.01 +3000 +\(640, 1, 1\)  void GemvKernel<1, 1, 2>\(GemvLaunch\)$' "$d/all"
grep -Eq '^ +52\.0 +150\.0 +2885 +\(sum of the 2 launches\)$' "$d/all"
test "$(grep -c Kernel "$d/one")" = 1 && grep -q GemvKernel "$d/one"
echo "not a csv" > "$d/bad.csv"
if python3 "$root/bench/ncu_kernels.py" "$d/bad.csv" > /dev/null 2> "$d/err"; then
  echo "a file without ncu's CSV must fail" >&2
  exit 1
fi
grep -q "no ncu CSV" "$d/err"
echo "ncu_kernels_test: ok"
