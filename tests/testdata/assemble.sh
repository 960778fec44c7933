#!/usr/bin/env bash
# Assembles the test models in BUILD/testdata from what tests/testdata commits, for every test
# (ctest's MOESHARD_TESTDATA, tests/e2e/run.sh): each committed file linked, qwen3moe-tok's
# tokenizer.json unpacked, and llama.cpp's model-f16.gguf and model-q8_0.gguf rebuilt by
# testdata_gguf (tests/testdata/rebuild_gguf.cc) and required to match the originals' SHA-256.
# Any failure is the build's failure: a test never finds a model missing.
#
#   tests/testdata/assemble.sh TESTDATA_GGUF_BINARY OUT_DIR
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 TESTDATA_GGUF_BINARY OUT_DIR" >&2
  exit 2
fi
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOL=$1
OUT=$2
mkdir -p "$OUT"
for dir in "$SRC"/*/; do
  name=$(basename "$dir")
  mkdir -p "$OUT/$name"
  for f in "$dir"*; do
    case $(basename "$f") in
      *.xz | gguf-layout.txt) ;;
      *) ln -sfn "$f" "$OUT/$name/$(basename "$f")" ;;
    esac
  done
done
TOK=$SRC/qwen3moe-tok
xz -dc "$TOK/tokenizer.json.xz" >"$OUT/qwen3moe-tok/tokenizer.json.tmp"
mv "$OUT/qwen3moe-tok/tokenizer.json.tmp" "$OUT/qwen3moe-tok/tokenizer.json"
heads=$(mktemp)
trap 'rm -f "$heads"' EXIT
xz -dc "$TOK/gguf-heads.xz" >"$heads"
"$TOOL" "$TOK/gguf-layout.txt" "$heads" "$TOK/model.safetensors" "$OUT/qwen3moe-tok"
status=0
while read -r kind file _ _ _ _ digest; do
  [[ $kind == file ]] || continue
  got=$(sha256sum "$OUT/qwen3moe-tok/$file" | cut -d' ' -f1)
  if [[ $got != "$digest" ]]; then
    echo "assemble: rebuilt $file is not llama.cpp's file (SHA-256 $got, want $digest)" >&2
    python3 "$SRC/gguf_recipe.py" --diff "$TOK/gguf-layout.txt" "$OUT/qwen3moe-tok/$file" >&2 || true
    rm -f "$OUT/qwen3moe-tok/$file"
    status=1
  fi
done <"$TOK/gguf-layout.txt"
exit $status
