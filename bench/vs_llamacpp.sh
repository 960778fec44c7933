#!/usr/bin/env bash
# moeshard against llama.cpp on one GPU, side by side on the same GGUF (issue 13): builds
# llama.cpp from ../shared/peers/llama.cpp-src.tar.xz into a cache folder (once), writes the
# Qwen3-30B-A3B-shaped GGUF with `moeshard make-model --preset full` (experts MXFP4 or Q8_0,
# every other matrix Q8_0, the Qwen3 tokenizer), serves it with `moeshard up --device cuda`
# (one worker) and with `llama-server -ngl 99 -fa on` in turn, drives both with the same
# `moeshard bench serve --stream` settings (concurrency levels; a long-prompt TTFT run), adds
# `llama-bench`, and compares the engines' decode without HTTP at every concurrency level:
# `moeshard bench-model` (a decode step of N sequences at the serve runs' context) against
# `llama-batched-bench` (N sequences, the same prompt and output lengths: its S_TG). Prints one
# table with both engines and the ratios (bench/vs_llamacpp_table.py), also written as JSON.
#
#   bench/vs_llamacpp.sh [--bin DIR] [--work DIR] [--out DIR] [--variants mxfp4,q8_0]
#       [--engines moeshard,llamacpp] [--concurrency 1,4,16,64] [--prompt-len 512] [--output-len 128]
#       [--prefill-len 4096] [--requests N] [--llama-dir DIR] [--skip-build] [--build-only]
#       [--no-llama-bench] [--no-bench-model] [--keep-models] [--jobs N] [--cpu-smoke]
#       [--step-tokens N] [--no-serve] [--long 32768,131072] [--long-output 32] [--long-kv bf16,fp8]
#       [--long-llama-kv f16,q8_0] [--long-step-tokens 16384] [--expert-layout auto|stream|stored]
#
# --bin: the folder with moeshard, moeshard-worker, -coordinator, -router (default: where
#   `moeshard` is on PATH, else build/). On the GPU machine: build here, pack with
#   ../shared/tools/device-bundle.sh .device/bundle build/moeshard build/moeshard-*, and run
#   `source .device/bundle/env.sh; bash bench/vs_llamacpp.sh ...` there.
# --work: models, logs and the llama.cpp build (default /tmp/vs-llamacpp); --llama-dir: a
#   folder with the llama.cpp programs this run's phases use already built (skips the build):
#   llama-server for the serve and --long runs, llama-bench unless --no-llama-bench,
#   llama-batched-bench unless --no-bench-model (e.g. built on the CPU machine for 90a and carried).
# --out: the table (table.txt), summary.json and each run's JSON (default WORK/out).
# --cpu-smoke: the plumbing on a CPU: a tiny synthetic model, moeshard only, short runs.
# --step-tokens: moeshard's --max-tokens-per-step for the serve runs (default: `up`'s, 4096 on a GPU).
# --no-serve: skip the concurrency and 4096-prefill runs (e.g. for a call that only runs --long).
# --no-bench-model: skip the engine-to-engine decode (bench-model and llama-batched-bench).
# --expert-layout: moeshard's experts as stored or repacked for the streaming kernels (`up` and
#   bench-model take it; default auto: MXFP4 and Q8_0 as stored, the long-prompt layout; stream: both
#   repacked, the decode layout).
# --long LENS: long prompts (issue 19): for each engine a server with one sequence and room for the
#   longest length, one request per length (prompt L, --long-output greedy tokens): TTFT, prefill
#   tok/s and decode speed at L. moeshard once per --long-kv KV dtype (bf16, fp8; auto = bf16 on
#   the GPU) with --max-tokens-per-step --long-step-tokens (default 16384: fewer, fuller steps for
#   the expert GEMMs; the workers' --max-batch-tokens raised to it above 8192); llama-server once per --long-llama-kv
#   cache type (f16 is its default; q8_0 = -ctk q8_0 -ctv q8_0).
# Phases can be split over calls: --build-only, then --variants mxfp4 --skip-build, ...
# Each run's results are kept in OUT, so a later call adds to the table.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# The shared folder: beside the repository, or inside it (as a device copy may carry it).
shared=$repo/../shared; [ -d "$shared" ] || shared=$repo/shared
bin="" work=/tmp/vs-llamacpp out="" variants=mxfp4,q8_0 engines=moeshard,llamacpp conc=1,4,16,64
prompt=512 output=128 prefill=4096 requests="" llama_dir="" skip_build=0 build_only=0 llama_bench=1
bench_model=1 keep=0 jobs=$(nproc) smoke=0 step_tokens="" do_serve=1 long="" long_out=32 long_kv=bf16
long_llama_kv=f16 long_step=16384 expert_layout=auto
die() { echo "vs_llamacpp: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift ;;
    --work) work=$2; shift ;;
    --out) out=$2; shift ;;
    --variants) variants=$2; shift ;;
    --engines) engines=$2; shift ;;
    --concurrency) conc=$2; shift ;;
    --prompt-len) prompt=$2; shift ;;
    --output-len) output=$2; shift ;;
    --prefill-len) prefill=$2; shift ;;
    --requests) requests=$2; shift ;;
    --llama-dir) llama_dir=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --skip-build) skip_build=1 ;;
    --build-only) build_only=1 ;;
    --no-llama-bench) llama_bench=0 ;;
    --no-bench-model) bench_model=0 ;;
    --keep-models) keep=1 ;;
    --cpu-smoke) smoke=1 ;;
    --step-tokens) step_tokens=$2; shift ;;
    --no-serve) do_serve=0 ;;
    --long) long=$2; shift ;;
    --long-output) long_out=$2; shift ;;
    --long-kv) long_kv=$2; shift ;;
    --long-llama-kv) long_llama_kv=$2; shift ;;
    --long-step-tokens) long_step=$2; shift ;;
    --expert-layout) expert_layout=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
  [ $# -gt 0 ] && shift
done
for v in ${variants//,/ }; do [[ $v == mxfp4 || $v == q8_0 ]] || die "--variants: mxfp4, q8_0 (got '$v')"; done
for e in ${engines//,/ }; do [[ $e == moeshard || $e == llamacpp ]] || die "--engines: moeshard, llamacpp (got '$e')"; done
[[ $conc =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--concurrency: a list like 1,4,16"
[ -z "$long" ] || [[ $long =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--long: a list of prompt lengths like 32768,131072"
for k in ${long_kv//,/ }; do [[ $k == bf16 || $k == fp8 || $k == auto || $k == float32 ]] || die "--long-kv: bf16, fp8, auto, float32 (got '$k')"; done
for k in ${long_llama_kv//,/ }; do [[ $k == f16 || $k == q8_0 || $k == bf16 ]] || die "--long-llama-kv: f16, q8_0, bf16 (got '$k')"; done
for n in "$long_out" "$long_step"; do [[ $n =~ ^[1-9][0-9]*$ ]] || die "--long-output and --long-step-tokens: positive counts"; done
[ -z "$step_tokens" ] || [[ $step_tokens =~ ^[1-9][0-9]*$ ]] || die "--step-tokens: a positive count"
[[ $expert_layout == auto || $expert_layout == stream || $expert_layout == stored ]] ||
  die "--expert-layout: auto, stream, stored (got '$expert_layout')"
layout_flag=(); [ "$expert_layout" != auto ] && layout_flag=(--expert-layout "$expert_layout")
device=cuda preset=full
if [ $smoke = 1 ]; then
  device=cpu preset=tiny engines=moeshard llama_bench=0 bench_model=0
  [ "$conc" = 1,4,16,64 ] && conc=1,4
  [ "$prompt" = 512 ] && prompt=32
  [ "$output" = 128 ] && output=8
  [ "$prefill" = 4096 ] && prefill=64
  [ "$long_kv" = bf16 ] && long_kv=auto
fi
if [ -z "$bin" ]; then
  if command -v moeshard > /dev/null; then bin=$(dirname "$(command -v moeshard)"); else bin=$repo/build; fi
fi
moeshard=$bin/moeshard
[ -x "$moeshard" ] || die "no moeshard in $bin (--bin)"
out=${out:-$work/out}
mkdir -p "$work" "$out"
abs() { (cd "$1" && pwd); }
work=$(abs "$work") out=$(abs "$out") bin=$(abs "$bin")
moeshard=$bin/moeshard
[ -z "$llama_dir" ] || llama_dir=$(abs "$llama_dir")
log() { echo "== $(date -u +%H:%M:%S) $*"; }
has() { [[ ,$1, == *,$2,* ]]; }

# The Qwen3 tokenizer that make-model embeds, checked before anything slow (the llama.cpp build):
# tokenizer.json, or tokenizer.json.xz (a carried copy may compress it), unpacked into WORK.
tokdir=$shared/testdata/qwen3moe-tok
if [ $smoke = 0 ] && [ "$build_only" = 0 ]; then
  if [ ! -f "$tokdir/tokenizer.json" ]; then
    [ -f "$tokdir/tokenizer.json.xz" ] || die "no tokenizer.json (or tokenizer.json.xz) in $tokdir"
    mkdir -p "$work/qwen3moe-tok"
    cp "$tokdir"/*.json "$work/qwen3moe-tok/" 2>/dev/null || true
    xz -dc "$tokdir/tokenizer.json.xz" > "$work/qwen3moe-tok/tokenizer.json" || die "could not unpack $tokdir/tokenizer.json.xz"
    tokdir=$work/qwen3moe-tok
  fi
fi

# llama.cpp, built once into WORK/llama (the build takes ~5 min on 16 cores).
if has "$engines" llamacpp; then
  llama_dir=${llama_dir:-$work/llama/build/bin}
  # The programs this run's phases use (a prebuilt folder may hold only those).
  needed=()
  { [ $do_serve = 1 ] || [ -n "$long" ]; } && needed+=(llama-server)
  [ $llama_bench = 1 ] && needed+=(llama-bench)
  [ $bench_model = 1 ] && needed+=(llama-batched-bench)
  missing=()
  for prog in "${needed[@]}"; do [ -x "$llama_dir/$prog" ] || missing+=("$prog"); done
  if [ ${#missing[@]} -gt 0 ]; then
    [ $skip_build = 0 ] || die "--skip-build but $llama_dir has no ${missing[*]}"
    tar=$shared/peers/llama.cpp-src.tar.xz
    [ -f "$tar" ] || die "no $tar"
    log "building llama.cpp in $work/llama (log: $work/llama-build.log)"
    rm -rf "$work/llama" && mkdir -p "$work/llama"
    tar xJf "$tar" -C "$work/llama"
    src=$work/llama; [ -f "$src/CMakeLists.txt" ] || src=$(dirname "$(ls "$work"/llama/*/CMakeLists.txt | head -1)")
    { cmake -S "$src" -B "$work/llama/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release &&
      cmake --build "$work/llama/build" -j "$jobs" --target llama-server llama-bench llama-batched-bench; } > "$work/llama-build.log" 2>&1 ||
      { tail -30 "$work/llama-build.log"; die "llama.cpp build failed (see $work/llama-build.log)"; }
    llama_dir=$work/llama/build/bin
  fi
  # A build made elsewhere and copied here (--llama-dir) finds its own libraries beside it.
  export LD_LIBRARY_PATH="$llama_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  log "llama.cpp: $llama_dir"
fi
[ $build_only = 1 ] && exit 0

maxc=$(tr , '\n' <<< "$conc" | sort -n | tail -1)
# Context per sequence: the longer of the two runs, rounded up to 256.
ctx=$(( ((prompt + output > prefill + 8 ? prompt + output : prefill + 8) + 255) / 256 * 256 ))
req_flag=(); [ -n "$requests" ] && req_flag=(--requests "$requests")

# http_ok URL: GET answers 200 (curl, or Python where the machine has no curl).
http_ok() {
  if command -v curl > /dev/null; then
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)" = 200 ]
  else
    python3 -c 'import sys, urllib.request; sys.exit(urllib.request.urlopen(sys.argv[1], timeout=5).status != 200)' \
      "$1" 2> /dev/null
  fi
}
# wait_ready URL PID LOG: until GET URL answers 200 (servers load 16 GiB first).
wait_ready() {
  for _ in $(seq 1 600); do
    kill -0 "$2" 2> /dev/null || { tail -20 "$3"; echo "vs_llamacpp: the server exited (log: $3)" >&2; return 1; }
    http_ok "$1" && return 0
    sleep 1
  done
  echo "vs_llamacpp: $1 not ready after 600 s (log: $3)" >&2; return 1
}
# The cluster credential of every `moeshard up` here (its internal /metrics need it).
export MOESHARD_CLUSTER_TOKEN=${MOESHARD_CLUSTER_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(16))')}
server_pid=""
stop_server() {
  [ -n "$server_pid" ] || return 0
  kill -TERM -- "-$server_pid" 2> /dev/null || true
  for _ in $(seq 1 30); do kill -0 "$server_pid" 2> /dev/null || break; sleep 1; done
  kill -KILL -- "-$server_pid" 2> /dev/null || true
  wait "$server_pid" 2> /dev/null || true
  server_pid=""
}
trap stop_server EXIT

# bench ENGINE VARIANT URL: the decode runs at every concurrency, then the prefill run.
bench() {
  local tag=$1-$2 rc=0
  log "$1 $2: bench serve --concurrency $conc, prompt $prompt, output $output"
  "$moeshard" bench serve --url "$3" --stream --concurrency "$conc" --prompt-len "$prompt" --output-len "$output" \
    --vocab "$vocab" "${req_flag[@]}" --json "$out/serve-$tag.json" 2>&1 | tee "$out/serve-$tag.log" || rc=1
  log "$1 $2: prefill, prompt $prefill"
  "$moeshard" bench serve --url "$3" --stream --concurrency 1 --requests 4 --prompt-len "$prefill" --output-len 2 \
    --vocab "$vocab" --seed 7 --json "$out/prefill-$tag.json" 2>&1 | tee "$out/prefill-$tag.log" || rc=1
  return $rc
}

# url_from_log PID LOG: the URL `moeshard up` prints (it picks free ports itself).
url_from_log() {
  for _ in $(seq 1 600); do
    kill -0 "$1" 2> /dev/null || return 1
    url=$(sed -n 's/^moeshard up: \(http[^ ]*\) grpc .*$/\1/p' "$2" | head -1)
    [ -n "$url" ] && return 0
    sleep 1
  done
  return 1
}
# serve ENGINE VARIANT URL READY_PATH LOG BENCH_FN COMMAND...: starts the server in its own process
# group, runs BENCH_FN ENGINE VARIANT URL once URL/READY_PATH answers (URL "": the one `moeshard up`
# prints), stops it.
serve() {
  local engine=$1 variant=$2 url=$3 ready=$4 slog=$5 fn=$6 rc=0
  shift 6
  log "$engine on $variant: $* (log: $slog)"
  setsid "$@" > "$slog" 2>&1 &
  server_pid=$!
  [ -n "$url" ] || url_from_log "$server_pid" "$slog" || { tail -20 "$slog"; url=http://no-url; }
  if wait_ready "$url$ready" "$server_pid" "$slog"; then "$fn" "$engine" "$variant" "$url" || rc=1; else rc=1; fi
  scrape_metrics "$engine" "$variant" "$slog" "$fn"
  stop_server
  return $rc
}

# scrape_metrics ENGINE VARIANT LOG BENCH_FN: after a moeshard run, every process's /metrics (router,
# coordinator, workers: the URLs `moeshard up` prints) into OUT/metrics-BENCH_FN-ENGINE-VARIANT-I.txt:
# the coordinator's step time and the worker's per-phase step time beside the served latencies.
scrape_metrics() {
  [[ $1 == moeshard* ]] || return 0
  local i=0 u
  for u in $(sed -n 's/^moeshard up: metrics //p' "$3" | head -1); do
    python3 -c 'import os, sys, urllib.request
r = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + os.environ["MOESHARD_CLUSTER_TOKEN"]})
sys.stdout.write(urllib.request.urlopen(r, timeout=10).read().decode())' "$u" > "$out/metrics-$4-$1-$2-$i.txt" 2> /dev/null || true
    i=$((i + 1))
  done
}

# Long prompts: one request per length at concurrency 1 (TTFT = prefill, TPOT = decode at L).
long_lens=${long//,/ }
long_max=0
for L in $long_lens; do [ "$L" -gt "$long_max" ] && long_max=$L; done
long_ctx=$(( (long_max + long_out + 16 + 255) / 256 * 256 ))
bench_long() {
  local rc=0 L
  for L in $long_lens; do
    log "$1 $2: long prompt $L, output $long_out"
    "$moeshard" bench serve --url "$3" --stream --concurrency 1 --requests 1 --prompt-len "$L" \
      --output-len "$long_out" --vocab "$vocab" --seed 11 --json "$out/long-$1-$2-$L.json" 2>&1 |
      tee "$out/long-$1-$2-$L.log" || rc=1
  done
  return $rc
}
# long_runs VARIANT MODEL: each engine and KV type in turn on the long prompts.
long_runs() {
  local v=$1 model=$2 rc=0 k tag port
  if has "$engines" moeshard; then
    for k in ${long_kv//,/ }; do
      tag=moeshard; [ "$k" = bf16 ] || tag=moeshard_$k
      serve "$tag" "$v" "" /ready "$out/up-long-$k-$v.log" bench_long \
        "$moeshard" up --model "$model" --device "$device" --workers 1 --max-model-len "$long_ctx" --max-num-seqs 1 \
        --num-kv-blocks $(( long_ctx / 16 + 16 )) --max-tokens-per-step "$long_step" \
        --max-batch-tokens $(( long_step > 8192 ? long_step : 8192 )) --kv-dtype "$k" "${layout_flag[@]}" || rc=1
    done
  fi
  if has "$engines" llamacpp; then
    for k in ${long_llama_kv//,/ }; do
      tag=llamacpp; [ "$k" = f16 ] || tag=llamacpp_$k
      port=$(free_port)
      serve "$tag" "$v" "http://127.0.0.1:$port" /health "$out/llama-server-long-$k-$v.log" bench_long \
        "$llama_dir/llama-server" -m "$model" -ngl 99 -fa on -c "$long_ctx" -np 1 -ctk "$k" -ctv "$k" \
        --host 127.0.0.1 --port "$port" || rc=1
    done
  fi
  return $rc
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

status=0
for v in ${variants//,/ }; do
  model=$work/qwen3moe-$preset-$v.gguf
  if [ ! -f "$model" ]; then
    log "make-model $v -> $model"
    tok=(--tokenizer "$tokdir"); [ $smoke = 1 ] && tok=(--synthetic)
    (cd "$repo" && "$moeshard" make-model --arch qwen3_moe --preset "$preset" --format gguf --expert-type "$v" \
      --dense-type q8_0 "${tok[@]}" --out "$model.part") && mv "$model.part" "$model"
    ls -l "$model"
  fi
  # Prompt ids below the first special token of the Qwen3 tokenizer (151,643); the smoke model's vocab.
  vocab=151643; [ $smoke = 1 ] && vocab=509
  step_flag=(); [ -n "$step_tokens" ] && step_flag=(--max-tokens-per-step "$step_tokens")
  if [ $do_serve = 1 ] && has "$engines" moeshard; then
    # KV for every stream's whole context (the coordinator's default pool is 1,024 blocks).
    serve moeshard "$v" "" /ready "$out/up-$v.log" bench \
      "$moeshard" up --model "$model" --device "$device" --workers 1 --max-model-len "$ctx" --max-num-seqs "$maxc" \
      --num-kv-blocks $(( (ctx / 16 + 1) * maxc + 16 )) "${step_flag[@]}" "${layout_flag[@]}" || status=1
  fi
  if [ $do_serve = 1 ] && has "$engines" llamacpp; then
    port=$(free_port)
    serve llamacpp "$v" "http://127.0.0.1:$port" /health "$out/llama-server-$v.log" bench \
      "$llama_dir/llama-server" -m "$model" -ngl 99 -fa on -c $((ctx * maxc)) -np "$maxc" --host 127.0.0.1 \
      --port "$port" || status=1
  fi
  if [ $llama_bench = 1 ] && has "$engines" llamacpp; then
    log "llama-bench -p $prompt,$prefill -n $output on $v"
    "$llama_dir/llama-bench" -m "$model" -ngl 99 -fa 1 -p "$prompt,$prefill" -n "$output" -o json \
      > "$out/llama-bench-$v.json" 2> "$out/llama-bench-$v.log" || { tail -5 "$out/llama-bench-$v.log"; status=1; }
  fi
  if [ -n "$long" ]; then long_runs "$v" "$model" || status=1; fi
  # Engine to engine, no HTTP: N sequences decoding at the serve runs' context (prompt + output).
  if [ $bench_model = 1 ] && has "$engines" moeshard; then
    log "moeshard bench-model, Qwen3-30B-A3B shape, experts $v, streams $conc, context $((prompt + output))"
    "$moeshard" bench-model --arch qwen3_moe --preset full-layer --layers 48 --expert-format "$v" \
      --dense-format q8_0 --prompt-len $((prompt + output)) --streams "$conc" "${layout_flag[@]}" \
      > "$out/bench-model-$v.txt" 2>&1 ||
      { tail -5 "$out/bench-model-$v.txt"; status=1; }
  fi
  if [ $bench_model = 1 ] && has "$engines" llamacpp; then
    if [ -x "$llama_dir/llama-batched-bench" ]; then
      log "llama-batched-bench -npp $prompt -ntg $output -npl $conc on $v"
      "$llama_dir/llama-batched-bench" -m "$model" -ngl 99 -fa on -c $((ctx * maxc)) -npp "$prompt" -ntg "$output" \
        -npl "$conc" --output-format jsonl > "$out/llama-batched-$v.jsonl" 2> "$out/llama-batched-$v.log" ||
        { tail -5 "$out/llama-batched-$v.log"; status=1; }
    else
      echo "vs_llamacpp: no llama-batched-bench in $llama_dir: the engine-to-engine rows have no llama.cpp figure" >&2
      status=1
    fi
  fi
  [ $keep = 1 ] || [ $smoke = 1 ] || rm -f "$model"
done
python3 "$here/vs_llamacpp_table.py" "$out" | tee "$out/table.txt"
echo "vs_llamacpp: table $out/table.txt, JSON $out/summary.json"
exit $status
