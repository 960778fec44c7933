#!/usr/bin/env bash
# The deployment files of deploy/, checked the way their tools and a running cluster see them:
#   1. every compose file passes `docker-compose config`, all YAML passes yamllint,
#      deploy/prometheus passes `promtool check config|rules` and the alert unit tests;
#   2. static wiring (check_static.py): Kubernetes manifests parse, kustomizations render
#      (kubectl kustomize, where installed) with selectors, ports, probes, flags and pool
#      addresses that agree; compose services, health checks and scrape targets agree;
#      dashboards are well formed; Dockerfile.cpu installs the build's packages;
#   3. live (check_live.py): `moeshard up` on a CPU model and a real Prometheus scraping it
#      with deploy/prometheus's config on loopback ports; every dashboard panel and alert
#      expression is asked of Prometheus.
# One line per check, then "N passed, M failed". Usage: tests/deploy/run.sh BUILD_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:?usage: run.sh BUILD_DIR}
build=$(cd "$build" 2>/dev/null && pwd || echo "$build")
cd "$root" || exit 1
export PYTHONDONTWRITEBYTECODE=1
passed=0 failed=0 skipped=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
tmp=$(mktemp -d /tmp/moeshard-deploy-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# Debian's python3 has PyYAML (python3-yaml, which yamllint needs too); prefer it.
py=""
for cand in /usr/bin/python3 python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import yaml' 2>/dev/null; then py=$cand; break; fi
done
for tool in docker-compose yamllint promtool prometheus curl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/install_deps.sh installs it)"
done
[ -n "$py" ] || fail "no python3 with PyYAML (python3-yaml) found"

# ---- 1. the tools' own checks
mkdir -p "$tmp/compose"
while IFS= read -r f; do
  out="$tmp/compose/$(echo "${f#./}" | sed "s#/#__#g").yml"
  if docker-compose -f "$f" config -q 2>"$tmp/err" && docker-compose -f "$f" config >"$out" 2>"$tmp/err"; then
    ok "docker-compose config accepts ${f#./}"
  else
    fail "docker-compose config accepts ${f#./}: $(tail -n 3 "$tmp/err" | tr '\n' ' ')"
  fi
done < <(find ./deploy -name 'docker-compose*.yml' -o -name 'docker-compose*.yaml' -o -name 'compose*.yml' -o -name 'compose*.yaml' | sort)
if yamllint -f parsable . >"$tmp/yamllint" 2>&1; then
  ok "yamllint passes on all YAML ($(yamllint --list-files . 2>/dev/null | wc -l) files)"
else
  fail "yamllint passes on all YAML: $(head -n 5 "$tmp/yamllint" | tr '\n' ' ')"
fi
# --syntax-only: the cluster credential's file (credentials_file) exists only in the Prometheus
# container; check_live.py checks the whole config, the file included, against a live cluster.
if promtool check config --syntax-only deploy/prometheus/prometheus.yml >"$tmp/out" 2>&1; then
  ok "promtool check config --syntax-only deploy/prometheus/prometheus.yml"
else
  fail "promtool check config deploy/prometheus/prometheus.yml: $(tr '\n' ' ' <"$tmp/out")"
fi
for f in $(grep -l '^groups:' deploy/prometheus/*.yml); do
  if promtool check rules "$f" >"$tmp/out" 2>&1; then
    ok "promtool check rules $f ($(grep -o '[0-9]* rules found' "$tmp/out"))"
  else
    fail "promtool check rules $f: $(tr '\n' ' ' <"$tmp/out")"
  fi
done
if promtool test rules tests/deploy/alerts_test.yml >"$tmp/out" 2>&1; then
  ok "promtool test rules tests/deploy/alerts_test.yml"
else
  fail "promtool test rules tests/deploy/alerts_test.yml: $(tr '\n' ' ' <"$tmp/out" | head -c 2000)"
fi

# ---- 2 and 3: the Python checks print their own lines and a closing "counts: P F S".
run_part() {
  local out="$tmp/part.out"
  "$py" "$@" 2>&1 | tee "$out" | grep -v '^counts: '
  read -r _ p f s < <(grep '^counts: ' "$out" | tail -n 1)
  if [ -z "${p:-}" ]; then
    fail "$(basename "$2") ran to its end"
    return
  fi
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}
if [ -n "$py" ]; then
  run_part "$here/check_static.py" "$root" "$build" "$tmp/compose"
  missing=""
  for b in moeshard moeshard-router moeshard-coordinator moeshard-worker; do
    [ -x "$build/$b" ] || missing="$missing $b"
  done
  if [ -n "$missing" ]; then
    fail "the live checks need$missing in $build"
  else
    # What the Dockerfiles' runtime stages install: the packages owning the binaries' libraries.
    if pk=$(sh deploy/docker/runtime-packages.sh "$build"/moeshard "$build"/moeshard-router \
        "$build"/moeshard-coordinator "$build"/moeshard-worker 2>"$tmp/err"); then
      ok "deploy/docker/runtime-packages.sh names the $(echo "$pk" | wc -l) packages the binaries load"
    else
      fail "deploy/docker/runtime-packages.sh names the packages the binaries load: $(cat "$tmp/err")"
    fi
    command -v prometheus >/dev/null && run_part "$here/check_live.py" "$root" "$build"
  fi
fi

line="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && line="$line, $skipped skipped"
echo "$line"
[ "$failed" -eq 0 ]
