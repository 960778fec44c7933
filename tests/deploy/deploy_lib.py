"""Shared helpers of the deploy checks: results, the endpoints each binary serves, how a
container's command reads, PromQL metric names, and Grafana dashboard expressions.

Only the standard library and PyYAML (python3-yaml, a dependency of yamllint)."""
import json
import re
import shlex
import sys

# What each binary serves over HTTP, by the flag that sets the port. check_live.py checks
# this table against started processes; check_static.py checks every probe, health check
# and monitor of deploy/ against it.
HTTP_PATHS = {
    ("moeshard-router", "port"): ["/health", "/ready", "/metrics"],
    ("moeshard-coordinator", "metrics-port"): ["/health", "/metrics"],
    ("moeshard-worker", "metrics-port"): ["/health", "/metrics"],
}
GRPC_PORT_FLAGS = {("moeshard-router", "grpc-port"), ("moeshard-coordinator", "port"), ("moeshard-worker", "port")}
PORT_FLAGS = ("port", "metrics-port", "grpc-port")
BINARIES = ("moeshard-router", "moeshard-coordinator", "moeshard-worker", "moeshard")


class Results:
    """One line per check: 'ok: ...', 'FAIL: ...' or 'skip: ...'."""

    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print(f"ok: {what}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL: {what}" + (f": {detail}" if detail else ""), flush=True)
        return ok

    def skip(self, what):
        self.skipped += 1
        print(f"skip: {what}", flush=True)

    def finish(self):
        # run.sh adds up the counts of every part.
        print(f"counts: {self.passed} {self.failed} {self.skipped}", flush=True)
        return 1 if self.failed else 0


def parse_command(tokens):
    """Reads a container's command (a list, or `sh -c SCRIPT`) into
    (binary, subcommand, {flag: value}); binary is None when no moeshard binary runs."""
    if len(tokens) >= 3 and tokens[0] in ("sh", "bash", "/bin/sh") and tokens[1] == "-c":
        script = " ".join(tokens[2:]).replace("\\\n", " ")
        # The command the script ends in: the one after `exec`, else the whole script.
        words = []
        for line in script.splitlines():
            try:
                words_line = shlex.split(line, comments=True)
            except ValueError:
                words_line = line.split()
            if "exec" in words_line:
                words = words_line[words_line.index("exec") + 1:]
        if not words:
            try:
                words = shlex.split(script, comments=True)
            except ValueError:
                words = script.split()
        tokens = words
    binary, sub, flags = None, None, {}
    for i, t in enumerate(tokens):
        name = t.rsplit("/", 1)[-1]
        if name in BINARIES:
            binary = name
            rest = tokens[i + 1:]
            if name == "moeshard" and rest and not rest[0].startswith("-"):
                sub, rest = rest[0], rest[1:]
            j = 0
            while j < len(rest):
                if rest[j].startswith("--"):
                    key = rest[j][2:]
                    if "=" in key:
                        key, val = key.split("=", 1)
                    elif j + 1 < len(rest) and not rest[j + 1].startswith("--"):
                        val = rest[j + 1]
                        j += 1
                    else:
                        val = ""
                    flags[key] = val
                j += 1
            break
    return binary, sub, flags


def help_flags(text):
    return set(re.findall(r"--([a-z][a-z0-9-]*)", text))


# ---- PromQL ----
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan", "atan2", "start", "end"}


def metric_names(expr):
    """The metric names a PromQL expression reads (functions, labels, keywords and
    durations left out)."""
    s = re.sub(r'"(\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"'(\\.|[^'\\])*'", "''", s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", s):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def exported_names(text):
    """The sample names of a /metrics page in the text exposition format."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, 1)[0])
    return names


# ---- Grafana ----
def panels(dashboard):
    for p in dashboard.get("panels", []):
        yield p
        for q in p.get("panels", []):
            yield q


def targets(dashboard):
    """(panel title, refId, expr) of every query of every panel."""
    for p in panels(dashboard):
        for t in p.get("targets", []):
            if "expr" in t:
                yield p.get("title", "?"), t.get("refId", "?"), t["expr"]


def variables(dashboard):
    return dashboard.get("templating", {}).get("list", [])


def substitute(expr, values):
    """Replaces $name and ${name} (and ${name:format}) by values[name]."""
    def rep(m):
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", rep, expr)


def label_values_query(definition):
    """label_values(SELECTOR, LABEL) -> (selector, label); label_values(LABEL) -> (None, label)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", definition, re.S)
    if m:
        return m.group(1).strip(), m.group(2)
    m = re.fullmatch(r"\s*label_values\(\s*(\w+)\s*\)\s*", definition)
    if m:
        return None, m.group(1)
    return None, None


def load_yaml_all(path):
    import yaml
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def die(msg):
    print(f"FAIL: {msg}", flush=True)
    print("counts: 0 1 0", flush=True)
    sys.exit(1)


def dump(obj):
    return json.dumps(obj, sort_keys=True)
