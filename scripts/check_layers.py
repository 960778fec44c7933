#!/usr/bin/env python3
"""Fails when an #include points up the layers of docs/architecture.md ("Layers").

Every C++/CUDA file under a layer folder may include only the layers that folder may see:

  common/            common/
  kernels/           common/, kernels/
  proto/             common/, proto/
  worker/            common/, kernels/, proto/, worker/
  coordinator/       common/, kernels/, proto/, coordinator/
  router/            common/, kernels/, proto/, router/
  local/             common/, kernels/, proto/, worker/, coordinator/, local/
  eval/              common/, kernels/, worker/, local/, eval/
  bench/             common/, kernels/, proto/, worker/, eval/, bench/
  cli/, tests/       anything

An include whose first path component is not a layer (absl/, grpcpp/, a file beside the includer)
is not checked. The allow-list names includes that are known and pending ("<file> <included path>"
per line, # comments); an entry that no longer matches an include is an error too, so the list
only shrinks.

Usage: check_layers.py [--root DIR] [--allow FILE]; exit 0 when clean, 1 on violations, 2 on misuse.
"""
import argparse
import os
import re
import sys

ALLOWED = {
    "common": {"common"},
    "kernels": {"common", "kernels"},
    "proto": {"common", "proto"},
    "worker": {"common", "kernels", "proto", "worker"},
    "coordinator": {"common", "kernels", "proto", "coordinator"},
    "router": {"common", "kernels", "proto", "router"},
    "local": {"common", "kernels", "proto", "worker", "coordinator", "local"},
    "eval": {"common", "kernels", "worker", "local", "eval"},
    "bench": {"common", "kernels", "proto", "worker", "eval", "bench"},
    "cli": None,  # anything
    "tests": None,
}
SOURCE_EXT = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def read_allow(path):
    entries = {}
    if not path:
        return entries
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path}:{n}: expected '<file> <included path>', got '{line}'")
            entries[(parts[0], parts[1])] = n
    return entries


def violations(root):
    """Yields (file, line number, included path, why) for every include that points up."""
    for layer in sorted(ALLOWED):
        top = os.path.join(root, layer)
        if ALLOWED[layer] is None or not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        first = target.split("/", 1)[0]
                        if "/" in target and first in ALLOWED and first not in ALLOWED[layer]:
                            yield rel, n, target, f"{layer}/ may include only {', '.join(sorted(ALLOWED[layer]))}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--allow", default=None, help="allow-list file of pending includes")
    a = ap.parse_args()
    try:
        allow = read_allow(a.allow)
    except (OSError, ValueError) as e:
        print(f"check_layers: {e}", file=sys.stderr)
        return 2
    bad, used = [], set()
    for rel, n, target, why in violations(a.root):
        if (rel, target) in allow:
            used.add((rel, target))
        else:
            bad.append(f"{rel}:{n}: includes {target} ({why})")
    for key in sorted(set(allow) - used):
        bad.append(f"{a.allow}:{allow[key]}: '{key[0]} {key[1]}' is allowed but no longer included: delete the entry")
    for b in bad:
        print(b)
    if bad:
        print(f"check_layers: {len(bad)} include(s) point up; see docs/architecture.md, Layers", file=sys.stderr)
        return 1
    print(f"check_layers: every include points down ({len(used)} pending allow-list entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
