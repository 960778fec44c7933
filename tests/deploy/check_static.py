"""Static checks of deploy/: Kubernetes manifests (parse, kustomization references, the
rendered overlays' selectors, ports, probes and flags), the compose files' wiring, the
dashboards' structure, the Dockerfiles against scripts/install_deps.sh.
Usage: check_static.py REPO_ROOT BUILD_DIR [COMPOSE_CONFIG_DIR]
COMPOSE_CONFIG_DIR holds `docker-compose config` outputs, one .yml per compose file."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

from deploy_lib import (GRPC_PORT_FLAGS, HTTP_PATHS, PORT_FLAGS, Results, help_flags, load_yaml_all,
                        parse_command, targets, variables)

R = Results()
ROOT, BUILD = sys.argv[1], sys.argv[2]
COMPOSE_OUT = sys.argv[3] if len(sys.argv) > 3 else None
K8S = os.path.join(ROOT, "deploy", "k8s")
rel = lambda p: os.path.relpath(p, ROOT)


# ---------------------------------------------------------------- binaries' flags
# How long each process drains on SIGTERM (router: --drain-timeout-s default; coordinator: kDrainSeconds).
DRAIN_SECONDS = {"moeshard-router": 10, "moeshard-coordinator": 30}

def binary_help():
    """{(binary, subcommand): set of flags} from each built binary's --help."""
    out = {}
    for name, sub in [("moeshard-router", None), ("moeshard-coordinator", None), ("moeshard-worker", None),
                      ("moeshard", "make-model"), ("moeshard", "up")]:
        path = os.path.join(BUILD, name)
        if not os.access(path, os.X_OK):
            continue
        argv = [path] + ([sub] if sub else []) + ["--help"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        out[(name, sub)] = help_flags(p.stdout + p.stderr)
    return out


HELP = binary_help()


def check_flags(where, binary, sub, flags):
    key = (binary, sub)
    if key not in HELP:
        R.skip(f"{where}: flags of {binary}{' ' + sub if sub else ''} (binary not built in {BUILD})")
        return
    unknown = sorted(set(flags) - HELP[key])
    R.check(not unknown, f"{where}: {binary}{' ' + sub if sub else ''} accepts {' '.join('--' + f for f in sorted(flags))}",
            f"not in its --help: {unknown}")


def served(where, binary, port, flags, path, kind="http"):
    """A probe or scrape of `path` on `port` of a container running `binary` with `flags`."""
    flag = next((f for f in PORT_FLAGS if flags.get(f) == str(port)), None)
    if flag is None:
        return R.check(False, f"{where}: port {port} is one the process listens on", f"no --port/--metrics-port/--grpc-port {port} in {flags}")
    if kind == "grpc":
        return R.check((binary, flag) in GRPC_PORT_FLAGS, f"{where}: port {port} (--{flag}) of {binary} speaks gRPC")
    paths = HTTP_PATHS.get((binary, flag))
    return R.check(paths is not None and path in paths, f"{where}: {binary} serves {path} on --{flag} {port}",
                   f"it serves {paths} there")


# ---------------------------------------------------------------- Kubernetes
def check_k8s_parse():
    files = sorted(glob.glob(os.path.join(K8S, "**", "*.yaml"), recursive=True))
    for f in files:
        try:
            docs = load_yaml_all(f)
            ok = all(isinstance(d, (dict, list)) for d in docs) and docs
            R.check(ok, f"{rel(f)} parses", "empty or not a mapping/list")
        except Exception as e:  # noqa: BLE001 - any parse error is the finding
            R.check(False, f"{rel(f)} parses", str(e).splitlines()[0])
    for f in sorted(glob.glob(os.path.join(K8S, "**", "*.json"), recursive=True)):
        try:
            json.load(open(f))
            R.check(True, f"{rel(f)} parses")
        except ValueError as e:
            R.check(False, f"{rel(f)} parses", str(e))


def kustomization_dirs():
    return sorted(os.path.dirname(f) for f in glob.glob(os.path.join(K8S, "**", "kustomization.yaml"), recursive=True))


def check_kustomization_refs():
    for d in kustomization_dirs():
        k = load_yaml_all(os.path.join(d, "kustomization.yaml"))[0]
        refs = list(k.get("resources", []))
        refs += [p["path"] for p in k.get("patches", []) if "path" in p]
        refs += list(k.get("patchesStrategicMerge", []))
        for g in k.get("configMapGenerator", []) + k.get("secretGenerator", []):
            refs += [f.split("=", 1)[-1] for f in g.get("files", [])]
        missing = []
        for r in refs:
            p = os.path.normpath(os.path.join(d, r))
            if os.path.isdir(p):
                if not os.path.exists(os.path.join(p, "kustomization.yaml")):
                    missing.append(r + " (folder without kustomization.yaml)")
            elif not os.path.isfile(p):
                missing.append(r)
        R.check(not missing, f"{rel(d)}/kustomization.yaml: all {len(refs)} referenced files exist", f"missing {missing}")


def render(d):
    kubectl = shutil.which("kubectl")
    p = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        R.check(False, f"kubectl kustomize {rel(d)}", p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed")
        return None
    docs = [x for x in yaml.safe_load_all(p.stdout) if x]
    R.check(True, f"kubectl kustomize {rel(d)} renders {len(docs)} objects")
    return docs


def pod_templates(docs):
    """(owner, template) of every pod template: Deployments, StatefulSets, LWS leader and worker."""
    for o in docs:
        kind, name = o.get("kind"), o.get("metadata", {}).get("name")
        spec = o.get("spec", {})
        if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield f"{kind}/{name}", spec.get("template", {})
        elif kind == "LeaderWorkerSet":
            lwt = spec.get("leaderWorkerTemplate", {})
            if "leaderTemplate" in lwt:
                yield f"{kind}/{name} leader", lwt["leaderTemplate"]
            yield f"{kind}/{name} worker", lwt.get("workerTemplate", {})


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def containers(template):
    spec = template.get("spec", {})
    return spec.get("containers", []), spec.get("initContainers", [])


def check_rendered(where, docs, complete):
    """Selectors, ports, probes, flags and references of one rendered set of objects."""
    templates = list(pod_templates(docs))
    by_kind = {}
    for o in docs:
        by_kind.setdefault(o.get("kind"), []).append(o)
    # Workload selectors select their own template.
    for o in docs:
        if o.get("kind") in ("Deployment", "StatefulSet"):
            sel = o["spec"].get("selector", {}).get("matchLabels", {})
            lab = o["spec"]["template"].get("metadata", {}).get("labels", {})
            R.check(matches(sel, lab), f"{where}: {o['kind']}/{o['metadata']['name']} selector matches its pod labels",
                    f"{sel} vs {lab}")
            if o["kind"] == "StatefulSet":
                svc = o["spec"].get("serviceName")
                names = [s["metadata"]["name"] for s in by_kind.get("Service", [])]
                R.check(svc in names, f"{where}: StatefulSet/{o['metadata']['name']} serviceName {svc} exists")
    # Services select pods, and name ports those pods declare.
    for s in by_kind.get("Service", []):
        sel = s["spec"].get("selector", {})
        hit = [(own, t) for own, t in templates if matches(sel, t.get("metadata", {}).get("labels", {}))]
        R.check(bool(hit), f"{where}: Service/{s['metadata']['name']} selects pods", f"no pod template has {sel}")
        for port in s["spec"].get("ports", []):
            tp = port.get("targetPort", port.get("port"))
            for own, t in hit:
                cports = [cp for c in containers(t)[0] for cp in c.get("ports", [])]
                ok = any(cp.get("name") == tp or cp.get("containerPort") == tp for cp in cports)
                R.check(ok, f"{where}: Service/{s['metadata']['name']} port {port.get('name')} -> {tp} exists in {own}")
    # Monitors select what exists and scrape named ports that serve /metrics.
    for m in by_kind.get("ServiceMonitor", []):
        sel = m["spec"].get("selector", {}).get("matchLabels", {})
        hit = [s for s in by_kind.get("Service", []) if matches(sel, s["metadata"].get("labels", {}))]
        R.check(bool(hit), f"{where}: ServiceMonitor/{m['metadata']['name']} selects a Service", f"none has labels {sel}")
        for ep in m["spec"].get("endpoints", []):
            for s in hit:
                sp = next((p for p in s["spec"]["ports"] if p.get("name") == ep.get("port")), None)
                if not R.check(sp is not None, f"{where}: ServiceMonitor/{m['metadata']['name']} port {ep.get('port')} "
                               f"is a port of Service/{s['metadata']['name']}"):
                    continue
                for own, t in templates:
                    if matches(s["spec"].get("selector", {}), t.get("metadata", {}).get("labels", {})):
                        check_scrape(f"{where}: ServiceMonitor/{m['metadata']['name']}", own, t,
                                     sp.get("targetPort", sp["port"]), ep.get("path", "/metrics"))
    for m in by_kind.get("PodMonitor", []):
        sel = m["spec"].get("selector", {}).get("matchLabels", {})
        hit = [(own, t) for own, t in templates if matches(sel, t.get("metadata", {}).get("labels", {}))]
        R.check(bool(hit), f"{where}: PodMonitor/{m['metadata']['name']} selects pods", f"no pod template has {sel}")
        for ep in m["spec"].get("podMetricsEndpoints", []):
            for own, t in hit:
                check_scrape(f"{where}: PodMonitor/{m['metadata']['name']}", own, t, ep.get("port"), ep.get("path", "/metrics"))
                # Coordinators' and workers' /metrics need the cluster credential: the Secret the
                # pods read it from.
                envs = [e for c in containers(t)[0] for e in c.get("env", []) if e.get("name") == "MOESHARD_CLUSTER_TOKEN"]
                ref = [e["valueFrom"]["secretKeyRef"] for e in envs if "secretKeyRef" in e.get("valueFrom", {})]
                auth = ep.get("authorization", {})
                R.check(auth.get("type") == "Bearer" and bool(ref) and auth.get("credentials") in
                        [{"name": r["name"], "key": r["key"]} for r in ref],
                        f"{where}: PodMonitor/{m['metadata']['name']} sends {own}'s cluster credential as a Bearer token",
                        f"authorization {auth}, the pods' secret {ref}")
    # Every container: its flags, and each probe on a port the process serves it on.
    for own, t in templates:
        main, init = containers(t)
        for c in main + init:
            binary, sub, flags = parse_command(list(c.get("command", [])) + list(c.get("args", [])))
            cw = f"{where}: {own} container {c['name']}"
            if binary is None:
                R.check(False, f"{cw} runs a moeshard binary", "no moeshard binary in its command")
                continue
            check_flags(cw, binary, sub, flags)
            for pname in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = c.get(pname)
                if c in main and probe is None:
                    R.check(False, f"{cw} has a {pname}")
                    continue
                if not probe:
                    continue
                if "httpGet" in probe:
                    port = resolve_port(c, probe["httpGet"]["port"])
                    served(f"{cw} {pname}", binary, port, flags, probe["httpGet"].get("path", "/"))
                elif "grpc" in probe:
                    served(f"{cw} {pname}", binary, probe["grpc"]["port"], flags, None, kind="grpc")
                else:
                    R.check(False, f"{cw} {pname} is an httpGet or grpc probe")
            if c in main and binary in DRAIN_SECONDS:
                # SIGTERM drains (router --drain-timeout-s 10, coordinator 30 s): the pod must wait
                # for it after a preStop pause that lets the endpoints drop the pod first.
                pre = c.get("lifecycle", {}).get("preStop")
                grace = t.get("spec", {}).get("terminationGracePeriodSeconds", 30)
                need = 5 + DRAIN_SECONDS[binary]
                R.check(pre is not None and grace > need,
                        f"{cw} drains on SIGTERM: a preStop and terminationGracePeriodSeconds > {need}",
                        f"preStop={pre} terminationGracePeriodSeconds={grace}")
            for cp in c.get("ports", []):
                R.check(str(cp["containerPort"]) in [flags.get(f) for f in PORT_FLAGS],
                        f"{cw} port {cp.get('name')} {cp['containerPort']} is one the process listens on",
                        f"flags {flags}")
    if not complete:
        return
    # References to ConfigMaps, claims; /dev/shm in memory; GPUs requested where the image is a GPU one.
    cms = {o["metadata"]["name"] for o in by_kind.get("ConfigMap", [])}
    pvcs = {o["metadata"]["name"] for o in by_kind.get("PersistentVolumeClaim", [])}
    for own, t in templates:
        spec = t.get("spec", {})
        for v in spec.get("volumes", []):
            if "configMap" in v:
                R.check(v["configMap"]["name"] in cms, f"{where}: {own} volume {v['name']} ConfigMap {v['configMap']['name']} exists")
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                R.check(claim in pvcs, f"{where}: {own} volume {v['name']} claim {claim} exists")
        for c in spec.get("containers", []):
            for ef in c.get("envFrom", []):
                if "configMapRef" in ef:
                    R.check(ef["configMapRef"]["name"] in cms, f"{where}: {own} envFrom ConfigMap {ef['configMapRef']['name']} exists")
            binary = parse_command(list(c.get("command", [])) + list(c.get("args", [])))[0]
            if binary == "moeshard-worker":
                shm = [v for v in spec.get("volumes", []) if v.get("emptyDir", {}).get("medium") == "Memory"
                       and any(m["name"] == v["name"] and m["mountPath"] == "/dev/shm" for m in c.get("volumeMounts", []))]
                R.check(bool(shm), f"{where}: {own} worker mounts a Memory-backed /dev/shm")
                gpu_image = "gpu" in c.get("image", "")
                gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
                R.check(bool(gpus) == gpu_image, f"{where}: {own} worker requests {'one GPU' if gpu_image else 'no GPU'}",
                        f"image {c.get('image')}, nvidia.com/gpu {gpus}")
                if gpu_image:
                    env = {e["name"]: e.get("value") for e in c.get("env", [])}
                    R.check(env.get("NCCL_NVLS_ENABLE") == "0", f"{where}: {own} worker sets NCCL_NVLS_ENABLE=0")
                    # The worker's default device is the CPU: a GPU image's worker must say cuda.
                    wflags = parse_command(list(c.get("command", [])) + list(c.get("args", [])))[2]
                    R.check(wflags.get("device") == "cuda", f"{where}: {own} worker computes on its GPU (--device cuda)",
                            f"flags {wflags}")
    check_pools(where, docs, by_kind)


def resolve_port(container, port):
    for cp in container.get("ports", []):
        if cp.get("name") == port:
            return cp["containerPort"]
    return port


def check_scrape(where, owner, template, port, path):
    for c in containers(template)[0]:
        binary, _, flags = parse_command(list(c.get("command", [])) + list(c.get("args", [])))
        names = [cp.get("name") for cp in c.get("ports", [])] + [cp["containerPort"] for cp in c.get("ports", [])]
        if port in names:
            served(f"{where} on {owner}", binary, resolve_port(c, port), flags, path)
            return
    R.check(False, f"{where} on {owner}: port {port} is declared by a container")


def check_pools(where, docs, by_kind):
    """pools.json names each coordinator at the address its pods get, with the context
    length the coordinator is started with."""
    pools_cm = [o for o in by_kind.get("ConfigMap", []) if "pools.json" in o.get("data", {})]
    engine_cm = {o["metadata"]["name"]: o.get("data", {}) for o in by_kind.get("ConfigMap", [])}
    if not R.check(len(pools_cm) == 1, f"{where}: one ConfigMap holds pools.json"):
        return
    pools = json.loads(pools_cm[0]["data"]["pools.json"])["pools"]
    if by_kind.get("LeaderWorkerSet"):  # the overlays: pools by length, a LeaderWorkerSet each
        lens = [p["max_model_len"] for p in pools]
        R.check(len(pools) >= 2 and len(set(lens)) == len(lens)
                and len(by_kind["LeaderWorkerSet"]) == len(pools),
                f"{where}: {len(pools)} pools of different lengths {lens}, one LeaderWorkerSet each")
    # Addresses coordinators get: LWS leaders <lws>-<i>.<lws>, StatefulSet pods <sts>-<i>.<svc>.
    known = {}
    for o in by_kind.get("LeaderWorkerSet", []):
        n = o["metadata"]["name"]
        lt = o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        for i in range(o["spec"].get("replicas", 1)):
            known[f"{n}-{i}.{n}"] = lt
    for o in by_kind.get("StatefulSet", []):
        n = o["metadata"]["name"]
        for i in range(o["spec"].get("replicas", 1)):
            known[f"{n}-{i}.{o['spec'].get('serviceName')}"] = o["spec"]["template"]
    for pool in pools:
        for addr in pool["coordinators"]:
            host, _, port = addr.rpartition(":")
            t = known.get(host)
            if not R.check(t is not None, f"{where}: pool {pool['name']} coordinator {addr} is a pod address",
                           f"known: {sorted(known)}"):
                continue
            c = containers(t)[0][0]
            binary, _, flags = parse_command(list(c.get("command", [])) + list(c.get("args", [])))
            R.check(binary == "moeshard-coordinator" and flags.get("port") == port,
                    f"{where}: pool {pool['name']} coordinator {addr} is a coordinator's --port")
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            for ef in c.get("envFrom", []):
                env.update(engine_cm.get(ef.get("configMapRef", {}).get("name"), {}))
            mml = flags.get("max-model-len", "")
            mml = env.get(mml.strip("${}()").lstrip("$"), mml) if mml.startswith("$") else mml
            # A step never larger than a GPU worker takes (--max-batch-tokens, 8192 by default).
            step = flags.get("max-tokens-per-step", "512")
            step = env.get(step.strip("${}()").lstrip("$"), step) if step.startswith("$") else step
            R.check(str(step).isdigit() and 1 <= int(step) <= 8192,
                    f"{where}: pool {pool['name']} coordinator's --max-tokens-per-step is a count of at most 8192",
                    f"coordinator has {step}")
            R.check(str(pool["max_model_len"]) == str(mml),
                    f"{where}: pool {pool['name']} max_model_len {pool['max_model_len']} is the coordinator's --max-model-len",
                    f"coordinator has {mml}")


def check_k8s():
    check_k8s_parse()
    check_kustomization_refs()
    if shutil.which("kubectl"):
        for d in kustomization_dirs():
            docs = render(d)
            if docs is not None:
                # The base and its parts (base/engine, base/long-pool) are not deployable alone.
                check_rendered(rel(d), docs, complete="base" not in rel(d).split(os.sep))
    else:
        R.skip("kubectl is not installed: the kustomizations are not rendered; checking their resources unpatched")
        for d in kustomization_dirs():
            check_rendered(rel(d) + " (unpatched)", plain_docs(d), complete=False)


def plain_docs(d):
    """The objects a kustomization lists under resources, without its patches or generators."""
    k = load_yaml_all(os.path.join(d, "kustomization.yaml"))[0]
    docs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(d, r))
        docs += plain_docs(p) if os.path.isdir(p) else [x for x in load_yaml_all(p) if isinstance(x, dict)]
    return docs


# ---------------------------------------------------------------- compose
def check_compose():
    if not COMPOSE_OUT:
        R.skip("compose wiring (no `docker-compose config` output given)")
        return
    prom = load_yaml_all(os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml"))[0]
    for f in sorted(glob.glob(os.path.join(COMPOSE_OUT, "*.yml"))):
        cfg = yaml.safe_load(open(f))
        where = os.path.basename(f)[:-len(".yml")].replace("__", "/")
        services = cfg.get("services", {})
        # name -> (service, binary, flags) for every network alias.
        by_alias = {}
        for name, s in services.items():
            cmd = s.get("command") or []
            cmd = cmd if isinstance(cmd, list) else ["sh", "-c", cmd]
            binary, sub, flags = parse_command(cmd)
            if binary is None:
                continue
            check_flags(f"{where} {name}", binary, sub, flags)
            if binary == "moeshard-worker" and "gpu" in str(s.get("image", "")):
                R.check(flags.get("device") == "cuda", f"{where} {name}: a GPU image's worker computes on its GPU (--device cuda)",
                        f"flags {flags}")
            if binary == "moeshard-coordinator" and "max-tokens-per-step" in flags:
                step = flags["max-tokens-per-step"]
                R.check(step.isdigit() and 1 <= int(step) <= 8192,
                        f"{where} {name}: --max-tokens-per-step is a count of at most 8192 (the workers' batch)", step)
            for net in (s.get("networks") or {}).values():
                for a in (net or {}).get("aliases", []):
                    by_alias.setdefault(a, []).append((name, s, binary, flags))
            hc = s.get("healthcheck", {}).get("test")
            if binary != "moeshard" and R.check(bool(hc), f"{where} {name} has a health check"):
                text = " ".join(hc) if isinstance(hc, list) else hc
                m = re.search(r"http://[^/\s:]+:(\d+)(/[\w/]*)", text)
                if R.check(bool(m), f"{where} {name} health check requests an HTTP URL", text):
                    served(f"{where} {name} health check", binary, int(m.group(1)), flags, m.group(2))
            if binary == "moeshard-coordinator":
                for addr in flags.get("workers", "").split(","):
                    host, _, port = addr.rpartition(":")
                    peers = [(n, x) for n, x in services.items()
                             if x.get("profiles") == s.get("profiles")
                             and host in [a for net in (x.get("networks") or {}).values() for a in (net or {}).get("aliases", [])]]
                    ok = len(peers) == 1 and parse_command(peers[0][1].get("command") or [])[2].get("port") == port
                    R.check(ok, f"{where} {name} worker {addr} is a worker's alias and --port in its profile",
                            f"services {[p[0] for p in peers]}")
        check_compose_pools(where, services)
        # Every scrape target of prometheus.yml is an alias whose process serves /metrics there.
        for job in prom["scrape_configs"]:
            tgts = [t for sc in job.get("static_configs", []) for t in sc.get("targets", [])]
            for sd in job.get("dns_sd_configs", []):
                tgts += [f"{n}:{sd['port']}" for n in sd.get("names", [])]
            for t in tgts:
                host, _, port = t.rpartition(":")
                procs = by_alias.get(host, [])
                if not procs and job.get("dns_sd_configs"):
                    continue  # a worker the compose file does not run: no target, by design
                if R.check(bool(procs), f"{where}: scrape target {t} ({job['job_name']}) is a service alias"):
                    for name, _, binary, flags in procs:
                        served(f"{where}: scrape {t} -> {name}", binary, int(port), flags, job.get("metrics_path", "/metrics"))
        # Every worker alias in a profile is scraped.
        names = {n for job in prom["scrape_configs"] for sd in job.get("dns_sd_configs", []) for n in sd.get("names", [])}
        for alias, procs in by_alias.items():
            if any(p[2] == "moeshard-worker" for p in procs):
                R.check(alias in names, f"{where}: worker alias {alias} is scraped by prometheus.yml")
        for name, s in services.items():
            img = s.get("image", "")
            R.check(re.search(r":[\w.-]*\d[\w.-]*$", img) is not None and not img.endswith(":latest"),
                    f"{where} {name} image {img} is pinned")


def check_compose_pools(where, services):
    """A router started with --pools gets its pools from $MOESHARD_POOLS: each coordinator is an
    alias and --port of a coordinator in the router's profile, started with the pool's
    max_model_len; the pools' lengths differ (pools by length)."""
    for name, s in services.items():
        cmd = s.get("command") or []
        binary, _, flags = parse_command(cmd if isinstance(cmd, list) else ["sh", "-c", cmd])
        if binary != "moeshard-router" or "pools" not in flags:
            continue
        env = s.get("environment") or {}
        text = env.get("MOESHARD_POOLS") if isinstance(env, dict) else None
        if not R.check(bool(text), f"{where} {name}: --pools comes from $MOESHARD_POOLS"):
            continue
        try:
            pools = json.loads(text)["pools"]
        except (ValueError, KeyError, TypeError) as e:
            R.check(False, f"{where} {name}: $MOESHARD_POOLS parses", str(e))
            continue
        lens = [p.get("max_model_len") for p in pools]
        R.check(len(pools) >= 2 and len(set(lens)) == len(lens),
                f"{where} {name}: {len(pools)} pools of different lengths ({lens})")
        for pool in pools:
            for addr in pool.get("coordinators", []):
                host, _, port = addr.rpartition(":")
                coords = [(n, parse_command(x.get("command") or [])[2]) for n, x in services.items()
                          if x.get("profiles") == s.get("profiles")
                          and parse_command(x.get("command") or [])[0] == "moeshard-coordinator"
                          and host in [a for net in (x.get("networks") or {}).values() for a in (net or {}).get("aliases", [])]]
                if not R.check(len(coords) == 1 and coords[0][1].get("port") == port,
                               f"{where} {name}: pool {pool['name']} coordinator {addr} is a coordinator's alias and --port",
                               f"services {[c[0] for c in coords]}"):
                    continue
                R.check(str(coords[0][1].get("max-model-len")) == str(pool.get("max_model_len")),
                        f"{where} {name}: pool {pool['name']} max_model_len {pool.get('max_model_len')} is "
                        f"{coords[0][0]}'s --max-model-len", f"it has {coords[0][1].get('max-model-len')}")


# ---------------------------------------------------------------- dashboards
def check_dashboards():
    files = sorted(glob.glob(os.path.join(ROOT, "deploy", "grafana", "dashboards", "*.json")))
    R.check(len(files) >= 2, f"deploy/grafana/dashboards holds the service and workers dashboards ({len(files)} files)")
    uids = []
    for f in files:
        where = rel(f)
        try:
            d = json.load(open(f))
        except ValueError as e:
            R.check(False, f"{where} parses", str(e))
            continue
        uids.append(d.get("uid"))
        names = [v["name"] for v in variables(d)]
        R.check("datasource" in names and "prefix" in names, f"{where} has the datasource and prefix variables", f"has {names}")
        exprs = list(targets(d))
        R.check(bool(exprs), f"{where} has panel queries ({len(exprs)})")
        hard = [e for _, _, e in exprs if re.search(r"\b(moeshard|vllm):", e)]
        R.check(not hard, f"{where}: every metric name takes the ${{prefix}} variable", f"{hard[:3]}")
        bad_ds = []
        for p in d.get("panels", []):
            if p.get("type") == "row":
                continue
            for obj in [p] + p.get("targets", []):
                if obj.get("datasource", {}).get("uid") != "${datasource}":
                    bad_ds.append(p.get("title"))
        R.check(not bad_ds, f"{where}: every panel and query uses the ${{datasource}} variable", f"{sorted(set(bad_ds))}")
        ids = [p.get("id") for p in d.get("panels", [])]
        R.check(len(ids) == len(set(ids)), f"{where}: panel ids are unique")
    R.check(len(uids) == len(set(uids)) and all(uids), "dashboard uids are set and unique", f"{uids}")
    prov = os.path.join(ROOT, "deploy", "grafana", "provisioning")
    R.check(os.path.isdir(os.path.join(prov, "datasources")) and os.path.isdir(os.path.join(prov, "dashboards")),
            "deploy/grafana/provisioning has datasources and dashboards")


# ---------------------------------------------------------------- Docker
def build_packages():
    text = open(os.path.join(ROOT, "scripts", "install_deps.sh")).read()
    m = re.search(r"^PKGS=\((.*?)^\)", text, re.S | re.M)
    if not m:
        return None
    body = "\n".join(line.split("#", 1)[0] for line in m.group(1).splitlines())
    return body.split()


def check_docker():
    pkgs = build_packages()
    if not R.check(bool(pkgs), "scripts/install_deps.sh has a PKGS=( ... ) list of the build's packages"):
        return
    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        path = os.path.join(ROOT, "deploy", "docker", name)
        if not R.check(os.path.isfile(path), f"deploy/docker/{name} exists"):
            continue
        text = open(path).read()
        words = set(re.findall(r"[\w.+-]+", text))
        missing = [p for p in pkgs if p not in words]
        if name == "Dockerfile.cpu" or not missing:
            R.check(not missing, f"deploy/docker/{name} installs all {len(pkgs)} build packages of install_deps.sh",
                    f"missing {missing}")
        args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
        froms = [re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), f)
                 for f in re.findall(r"^FROM\s+(\S+)", text, re.M)]
        unpinned = [f for f in froms if ":" not in f or f.endswith(":latest") or not re.search(r":.*\d", f)]
        R.check(froms and not unpinned, f"deploy/docker/{name} base images are pinned ({', '.join(sorted(set(froms)))})",
                f"unpinned {unpinned}")
        users = re.findall(r"^USER\s+(\S+)", text, re.M)
        R.check(bool(users) and users[-1].split(":")[0] not in ("root", "0"), f"deploy/docker/{name} runs as a non-root user")
    di = os.path.join(ROOT, ".dockerignore")
    if R.check(os.path.isfile(di), ".dockerignore exists"):
        lines = {l.strip() for l in open(di) if l.strip() and not l.startswith("#")}
        R.check({".git", "build", "build-*"} <= lines, ".dockerignore leaves out .git and the build folders")


check_k8s()
check_compose()
check_dashboards()
check_docker()
sys.exit(R.finish())
