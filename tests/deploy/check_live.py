"""The monitoring stack against a running cluster: starts `moeshard up` on a CPU model and a
real Prometheus whose configuration is deploy/prometheus/prometheus.yml pointed at the
loopback ports `moeshard up` printed, sends requests, then asks Prometheus for every
expression of every dashboard panel and alert rule. Stops everything it started.
Usage: check_live.py REPO_ROOT BUILD_DIR"""
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

from deploy_lib import (HTTP_PATHS, Results, exported_names, label_values_query, metric_names, substitute, targets,
                        variables)

R = Results()
ROOT, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TMP = tempfile.mkdtemp(prefix="moeshard-deploy-")
PROCS = []  # (name, Popen), each the leader of its own process group
RATE_INTERVAL = "1m"


def stop_all():
    for name, p in reversed(PROCS):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + 15
    for name, p in reversed(PROCS):
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            print(f"note: {name} (pid {p.pid}) ignored SIGTERM; killing its process group", flush=True)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    PROCS.clear()


def start(name, argv, **kw):
    p = subprocess.Popen(argv, start_new_session=True, **kw)
    PROCS.append((name, p))
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The cluster credential this check gives `moeshard up`: coordinators' and workers' /metrics need it.
TOKEN = os.urandom(32).hex()


def http(url, data=None, timeout=30, token=None):
    headers = {"Content-Type": "application/json"} if data else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return None, str(e)


def promql(prom, expr):
    """(ok, error or result list) of an instant query."""
    data = urllib.parse.urlencode({"query": expr}).encode()
    req = urllib.request.Request(f"{prom}/api/v1/query", data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        return False, f"{body.get('errorType')}: {body.get('error')}"
    return True, body["data"]["result"]


def read_until(p, want, timeout):
    """Lines p prints on stdout until one starts with `want` (or p exits, or time runs out)."""
    q = queue.Queue()
    threading.Thread(target=lambda: [q.put(l.rstrip("\n")) for l in p.stdout], daemon=True).start()
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        try:
            line = q.get(timeout=0.5)
        except queue.Empty:
            if p.poll() is not None:
                break
            continue
        lines.append(line)
        if line.startswith(want):
            break
    return lines


def main():
    model = os.path.join(TMP, "model")
    mk = subprocess.run([os.path.join(BUILD, "moeshard"), "make-model", "--arch", "muse_spark", "--preset", "tiny", "--nvfp4",
                         "--seed", "7", "--out", model], capture_output=True, text=True, timeout=300)
    if not R.check(mk.returncode == 0, "moeshard make-model writes the CPU demo model", mk.stderr.strip()[-300:]):
        return
    # ---- the cluster (--max-model-len: the router needs each pool's length)
    up_log = os.path.join(TMP, "up.log")
    p = start("moeshard up", [os.path.join(BUILD, "moeshard"), "up", "--model", model, "--workers", "2",
                              "--mode", "layer-split", "--max-model-len", "2048"],
              stdout=subprocess.PIPE, stderr=open(up_log, "w"), text=True,
              env={**os.environ, "MOESHARD_CLUSTER_TOKEN": TOKEN})
    lines = read_until(p, "moeshard up: ready", 240)
    if not R.check(any(l.startswith("moeshard up: ready") for l in lines),
                   "moeshard up starts a router, a coordinator and 2 workers and reports ready",
                   " | ".join(lines) + " | " + open(up_log).read()[-800:]):
        return
    url = next(l.split()[2] for l in lines if re.match(r"moeshard up: http://", l))
    metrics_urls = next(l.split()[3:] for l in lines if l.startswith("moeshard up: metrics "))
    # ---- what each process exports, and the endpoints deploy/ relies on
    roles = {"router": [], "coordinator": [], "worker": []}
    exported = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added",
                "scrape_samples_post_metric_relabeling"}
    for mu in metrics_urls:
        code, text = http(mu, token=TOKEN)
        R.check(code == 200, f"{mu} answers")
        if "router_" not in text:
            R.check(http(mu)[0] == 401 and http(mu, token="wrong-" + TOKEN)[0] == 401,
                    f"{mu} refuses a scrape without the cluster credential, and with a wrong one")
        role = "router" if "router_" in text else "worker" if "moeshard_worker_" in text else "coordinator"
        roles[role].append(mu.split("/")[2])
        # Default names (moeshard_<name>) are what promtool accepts: no lint at all.
        pt = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        R.check(pt.returncode == 0 and not (pt.stdout + pt.stderr).strip(), f"promtool check metrics accepts {mu} ({role})",
                f"exit {pt.returncode}: {(pt.stdout + pt.stderr)[:500]}")
        binary = f"moeshard-{role}"
        flag = "port" if role == "router" else "metrics-port"
        for path in HTTP_PATHS[(binary, flag)]:
            code, body = http(f"http://{mu.split('/')[2]}{path}", token=TOKEN)
            R.check(code == 200, f"{binary} serves {path} on its --{flag} ({mu.split('/')[2]})", f"HTTP {code} {body[:200]}")
    R.check(len(roles["router"]) == 1 and len(roles["coordinator"]) == 1 and len(roles["worker"]) == 2,
            f"moeshard up printed the metrics URLs of 1 router, 1 coordinator, 2 workers", f"{roles}")
    # ---- Prometheus with the repository's scrape config on these ports
    src = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")
    cfg = yaml.safe_load(open(src))
    cfg["global"].update({"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"})
    cfg["rule_files"] = [os.path.join(os.path.dirname(src), f) for f in cfg.get("rule_files", [])]
    token_file = os.path.join(TMP, "moeshard-cluster-token")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(TOKEN)
    for job in cfg["scrape_configs"]:
        role = next((r for r in roles if r in job["job_name"]), None)
        if not R.check(role is not None, f"scrape job {job['job_name']} is the router's, coordinators' or workers'"):
            continue
        for k in [k for k in job if k.endswith("_sd_configs") or k == "static_configs"]:
            del job[k]
        job["static_configs"] = [{"targets": roles[role]}]
        if role != "router":
            R.check("credentials_file" in job.get("authorization", {}),
                    f"scrape job {job['job_name']} sends the cluster credential (authorization.credentials_file)")
            job["authorization"] = {"credentials_file": token_file}
    gen = os.path.join(TMP, "prometheus.yml")
    yaml.safe_dump(cfg, open(gen, "w"), sort_keys=False)
    pc = subprocess.run(["promtool", "check", "config", gen], capture_output=True, text=True)
    R.check(pc.returncode == 0, "the scrape config pointed at the loopback ports passes promtool", pc.stdout + pc.stderr)
    port = free_port()
    prom = f"http://127.0.0.1:{port}"
    start("prometheus", ["prometheus", f"--config.file={gen}", f"--storage.tsdb.path={os.path.join(TMP, 'tsdb')}",
                         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
          stdout=open(os.path.join(TMP, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
    ok = False
    for _ in range(100):
        if http(f"{prom}/-/ready", timeout=2)[0] == 200:
            ok = True
            break
        time.sleep(0.2)
    if not R.check(ok, f"prometheus serves on {prom}", open(os.path.join(TMP, "prometheus.log")).read()[-500:]):
        return
    health = {}
    for _ in range(60):
        code, body = http(f"{prom}/api/v1/targets")
        if code == 200:
            health = {t["scrapeUrl"]: t["health"] for t in json.loads(body)["data"]["activeTargets"]}
            if len(health) == 4 and all(h == "up" for h in health.values()):
                break
        time.sleep(0.5)
    R.check(len(health) == 4 and all(h == "up" for h in health.values()), "prometheus scrapes all 4 processes", f"{health}")
    # ---- load
    code, body = http(f"{url}/v1/models")
    model_id = json.loads(body)["data"][0]["id"] if code == 200 else "?"
    R.check(code == 200, f"GET /v1/models lists the model ({model_id})", body[:200])
    sent = 0
    for i in range(4):
        req = {"model": model_id, "prompt": f"The quick brown fox {i}", "max_tokens": 8, "temperature": 0}
        r = subprocess.run(["curl", "-sS", "-m", "60", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
                            "-d", json.dumps(req), f"{url}/v1/completions"], capture_output=True, text=True)
        body, _, code = r.stdout.rpartition("\n")
        sent += 1
        try:
            ok = code == "200" and json.loads(body)["choices"][0]["text"] is not None
        except (ValueError, KeyError, IndexError, TypeError):
            ok = False
        R.check(ok, f"POST /v1/completions #{i + 1} answers 200 with a choice", f"HTTP {code} {body[:200]}")
    req = {"model": model_id, "prompt": "Streamed: once upon a time", "max_tokens": 8, "stream": True}
    r = subprocess.run(["curl", "-sS", "-N", "-m", "60", "-H", "Content-Type: application/json", "-d", json.dumps(req),
                        f"{url}/v1/completions"], capture_output=True, text=True)
    sent += 1
    events = [l for l in r.stdout.splitlines() if l.startswith("data:")]
    R.check(len(events) >= 2 and events[-1].strip() == "data: [DONE]", f"a streamed completion sends {len(events)} events ending in [DONE]",
            r.stdout[-300:] + r.stderr)
    # A refused request, for the rejections panel.
    r = subprocess.run(["curl", "-sS", "-m", "30", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                        "Content-Type: application/json", "-d", "{not json", f"{url}/v1/completions"],
                       capture_output=True, text=True)
    R.check(r.stdout.startswith("4"), f"a malformed request is refused ({r.stdout})")
    # ---- wait until Prometheus has scraped the finished requests
    seen = 0
    for _ in range(60):
        okq, res = promql(prom, "sum(moeshard_router_requests_total)")
        seen = float(res[0]["value"][1]) if okq and res else 0
        if seen >= sent:
            break
        time.sleep(0.5)
    time.sleep(3)
    R.check(seen >= sent, f"prometheus has scraped the {sent} requests (router_requests_total = {seen:g})")
    # What every process exports now.
    raw = set()
    for mu in metrics_urls:
        raw |= exported_names(http(mu, token=TOKEN)[1])
    exported |= raw
    # The recording rules name every exported family again as moeshard:<name> (vLLM's
    # style, what the dashboards query): each must have its rule, and its series must be in
    # Prometheus with the same value as the raw one.
    rec_file = os.path.join(ROOT, "deploy", "prometheus", "recording_rules.yml")
    recorded = {r["record"]: r["expr"] for g in yaml.safe_load(open(rec_file))["groups"] for r in g["rules"]}
    own = sorted(n for n in raw if n.startswith("moeshard_"))
    norule = [n for n in own if recorded.get("moeshard:" + n[len("moeshard_"):]) != n]
    R.check(own and not norule, f"recording_rules.yml records all {len(own)} exported moeshard_ series as moeshard:<name>",
            f"no rule for {norule}")
    stale = sorted(r for r, e in recorded.items() if e not in raw)
    R.check(not stale, "every recording rule reads a series some process exports", f"nothing exports {stale}")
    exported |= {r for r, e in recorded.items() if e in raw}
    okq, a = promql(prom, "sum(moeshard:generation_tokens_total)")
    okr, b = promql(prom, "sum(moeshard_generation_tokens_total)")
    va = float(a[0]["value"][1]) if okq and a else -1
    vb = float(b[0]["value"][1]) if okr and b else -2
    R.check(va == vb and va > 0, f"prometheus has moeshard:generation_tokens_total = moeshard_generation_tokens_total ({va:g}, {vb:g})")
    # ---- dashboards
    for f in sorted(os.listdir(os.path.join(ROOT, "deploy", "grafana", "dashboards"))):
        if not f.endswith(".json"):
            continue
        d = json.load(open(os.path.join(ROOT, "deploy", "grafana", "dashboards", f)))
        values = {"prefix": "moeshard", "__rate_interval": RATE_INTERVAL, "__interval": "15s", "__range": "1h"}
        for v in variables(d):
            if v["type"] != "query":
                continue
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            selector, label = label_values_query(substitute(q, values))
            okq, res = promql(prom, f"group by ({label}) ({selector})") if selector else (False, "unsupported")
            vals = sorted({r["metric"].get(label, "") for r in res}) if okq else []
            R.check(bool(vals), f"{f}: variable ${v['name']} has values ({'|'.join(vals)})", f"{res}")
            values[v["name"]] = "|".join(vals) if vals else ".+"
        used = set()
        for title, ref, expr in targets(d):
            e = substitute(expr, values)
            used |= metric_names(e)
            okq, res = promql(prom, e)
            R.check(okq and len(res) > 0, f"{f}: panel '{title}' {ref} returns data ({len(res) if okq else 0} series)",
                    f"{res if not okq else 'empty result'} for {e}")
        missing = sorted(used - exported)
        R.check(not missing, f"{f}: all {len(used)} metric names its panels use are exported", f"no process exports {missing}")
        # The same panels on a vLLM server's metrics: only the prefix changes, so they must parse.
        vvals = dict(values, prefix="vllm", job=".+", instance=".+")
        bad = []
        for title, ref, expr in targets(d):
            okq, res = promql(prom, substitute(expr, vvals))
            if not okq:
                bad.append(f"{title} {ref}: {res}")
        R.check(not bad, f"{f}: every panel parses with prefix=vllm", "; ".join(bad))
    # ---- alert rules
    used = set()
    for rf in cfg["rule_files"]:
        for g in yaml.safe_load(open(rf))["groups"]:
            for rule in g["rules"]:
                used |= metric_names(rule["expr"])
                okq, res = promql(prom, rule["expr"])
                R.check(okq, f"{os.path.basename(rf)}: {rule.get('alert') or rule.get('record')} parses and evaluates", f"{res}")
    missing = sorted(used - exported)
    R.check(not missing, f"alert rules: all {len(used)} metric names they use are exported", f"no process exports {missing}")
    code, body = http(f"{prom}/api/v1/rules")
    rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]] if code == 200 else []
    bad = [f"{r['name']}: {r.get('lastError')}" for r in rules if r.get("health") == "err"]
    R.check(rules and not bad, f"prometheus loaded {len(rules)} alerting and recording rules and evaluates them without error",
            "; ".join(bad))
    firing = [r["name"] for r in rules if r.get("state") == "firing"]
    R.check(not firing, "no alert fires on a healthy cluster", f"firing: {firing}")


signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that `finally` stops what was started
try:
    main()
except Exception as e:  # noqa: BLE001 - reported as a failed check, then everything stops
    import traceback
    traceback.print_exc()
    R.check(False, "the live checks ran to the end", repr(e))
finally:
    stop_all()
    subprocess.run(["rm", "-rf", TMP])
sys.exit(R.finish())
