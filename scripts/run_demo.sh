#!/usr/bin/env bash
# `make run`: start a local cluster on the model, send one chat request through the
# OpenAI API, print the answer, stop the cluster. Usage: run_demo.sh BUILD_DIR MODEL PROMPT
set -euo pipefail
build=$1 model=$2 prompt=$3
log=$(mktemp)
"$build/moeshard" up --model "$model" --workers 2 --mode tensor-parallel > "$log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  grep -q "moeshard up: ready" "$log" && break
  kill -0 $up 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
grep -q "moeshard up: ready" "$log" || { cat "$log"; echo "cluster did not become ready"; exit 1; }
url=$(sed -n 's/^moeshard up: \(http:[^ ]*\) grpc.*/\1/p' "$log" | head -1)
echo "moeshard is serving $model at $url (2 workers, tensor parallel)"
echo "POST $url/v1/completions {\"prompt\": \"$prompt\", \"max_tokens\": 32}"
body=$(printf '{"prompt": %s, "max_tokens": 32, "temperature": 0}' "$(printf '%s' "$prompt" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))' 2>/dev/null || printf '"%s"' "$prompt")")
curl -sS "$url/v1/completions" -H 'Content-Type: application/json' -d "$body" > "$log.resp"
python3 - "$log.resp" "$prompt" <<'PY' 2>/dev/null || cat "$log.resp"
import json, sys
r = json.load(open(sys.argv[1]))
print("\n" + sys.argv[2] + r["choices"][0]["text"])
print("\n(usage: %s)" % json.dumps(r["usage"]))
PY
rm -f "$log.resp"
