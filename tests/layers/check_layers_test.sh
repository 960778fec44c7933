#!/usr/bin/env bash
# The layer check itself (scripts/check_layers.py) on fixture trees written here: a clean tree
# passes; each rule's violation fails and names the file, the line and the include; the
# allow-list lets a pending include through and fails on an entry that no longer matches.
set -u
check="python3 $1/scripts/check_layers.py"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fails=0

put() {  # put TREE FILE LINE...: writes FILE (under TREE) with the given lines
  local tree=$1 file=$2
  shift 2
  mkdir -p "$(dirname "$d/$tree/$file")"
  printf '%s\n' "$@" > "$d/$tree/$file"
}
expect() {  # expect RC NAME ARGS...: runs the checker, compares its exit status
  local want=$1 name=$2
  shift 2
  $check "$@" > "$d/out" 2>&1
  local rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL $name: exit $rc, want $want"; sed 's/^/  /' "$d/out"; fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
expect_out() {  # expect_out NAME TEXT: the last run printed TEXT
  if ! grep -qF -- "$2" "$d/out"; then
    echo "FAIL $1: output lacks '$2'"; sed 's/^/  /' "$d/out"; fails=$((fails + 1))
  fi
}

# A tree where every include points down (third-party and same-folder includes are not checked).
clean() {
  put "$1" common/a.h '#include "absl/status/status.h"' '#include "common/b.h"'
  put "$1" kernels/k.cc '#include "common/a.h"' '#include "kernels/k.h"' '#include <vector>'
  put "$1" worker/w.cc '#include "common/a.h"' '#include "kernels/k.h"' '#include "proto/moeshard.pb.h"'
  put "$1" coordinator/c.cc '#include "common/a.h"' '#include "proto/moeshard.pb.h"' '#include "plan.h"'
  put "$1" router/r.cc '#include "common/a.h"' '#include "router/r.h"'
  put "$1" eval/e.cc '#include "worker/w.h"' '#include "kernels/k.h"'
  put "$1" bench/b.cc '#include "worker/w.h"' '#include "eval/e.h"' '#include "common/openai_client/c.h"'
  put "$1" cli/x.cc '#include "bench/b.h"' '#include "router/r.h"' '#include "coordinator/c.h"'
  put "$1" tests/t.cc '#include "cli/x.h"' '#include "router/r.h"'
}
clean base
expect 0 "clean tree" --root "$d/base"

# One violation per rule, each in a copy of the clean tree.
n=0
while read -r file inc; do
  n=$((n + 1))
  clean "v$n"
  put "v$n" "$file" "// top" "#include \"$inc\""
  expect 1 "$file -> $inc" --root "$d/v$n"
  expect_out "$file -> $inc" "$file:2: includes $inc"
done <<'RULES'
common/x.h worker/w.h
common/x.cc coordinator/c.h
common/x.cc router/r.h
common/x.cc cli/x.h
common/x.cc bench/b.h
common/x.cc kernels/k.h
kernels/x.cu worker/w.h
kernels/x.cuh bench/b.h
worker/x.cc coordinator/c.h
worker/sub/x.h router/r.h
worker/x.cc cli/args.h
coordinator/x.cc router/r.h
coordinator/x.cc worker/model_loader.h
coordinator/x.cc cli/args.h
router/x.cc coordinator/c.h
router/x.cc worker/w.h
router/x.cc cli/x.h
bench/x.cc cli/x.h
bench/x.cc tests/t.h
eval/x.cc cli/x.h
eval/x.cc bench/b.h
eval/x.cc router/r.h
RULES

# Angle brackets and spacing do not hide an include.
clean angle
put angle worker/y.cc '#  include <coordinator/c.h>'
expect 1 "angle-bracket include" --root "$d/angle"

# The allow-list: a listed include passes, an unlisted one still fails, a stale entry fails.
clean allow
put allow coordinator/s.h '#include "worker/sampler.h"'
printf '# pending\ncoordinator/s.h worker/sampler.h\n' > "$d/list"
expect 0 "allow-listed include" --root "$d/allow" --allow "$d/list"
put allow router/z.cc '#include "worker/w.h"'
expect 1 "unlisted include beside a listed one" --root "$d/allow" --allow "$d/list"
expect_out "unlisted include" "router/z.cc:1: includes worker/w.h"
clean stale
expect 1 "stale allow-list entry" --root "$d/stale" --allow "$d/list"
expect_out "stale entry" "no longer included"
printf 'coordinator/s.h\n' > "$d/badlist"
expect 2 "malformed allow-list" --root "$d/stale" --allow "$d/badlist"

# And the repository itself.
expect 0 "this repository" --root "$1" --allow "$1/scripts/layers_allowlist.txt"

[ "$fails" = 0 ] && echo "check_layers_test: all passed" || echo "check_layers_test: $fails failed"
[ "$fails" = 0 ]
