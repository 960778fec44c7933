#!/usr/bin/env python3
"""Fails when two .cc files of one folder define a free function of the same name and at least one
of them is file-local (in `namespace {` or `static`).

The Makefile's builds are unity builds (CMAKE_UNITY_BUILD: a target's sources compiled a batch at a
time as one translation unit). There, a file-local helper is visible to the files after it in the
batch: a second definition with the same signature fails to compile (loud), but one with another
signature silently takes part in overload resolution — `Chunk(1, 10, {7}, {0, 1, 2})` bound to a
neighbour's `Chunk(int64_t, int64_t, int, std::vector<int32_t>)` instead of its own file's
`Chunk(int64_t, int64_t, std::vector<int32_t>, std::vector<int32_t>)`. Give such helpers distinct
names. Types, constants and aliases are not checked: a second definition of those never compiles.
A `using namespace` at file scope (other than a `*_literals` one) fails too: it would reach the
files after it in the batch.

A folder stands for a target (one library per folder; a test folder's targets share helpers'
names only by accident). Top-level definitions only (the style's namespaces are not indented).

Usage: check_unity.py [--root DIR]; exit 0 when clean, 1 when a name is defined twice or a
file-scope `using namespace` is found.
"""
import argparse
import collections
import os
import re
import sys

SKIP_DIRS = {".git", "shared", "node_modules", "third_party"}
# A top-level function definition or declaration: `[static] [constexpr] type Name(`, the name not
# qualified (Foo::Bar, a member, does not match) and not a keyword or macro call.
FUNCTION = re.compile(r"^(static\s+)?(?:(?:inline|constexpr|template\s*<[^>]*>)\s+)*"
                      r"[A-Za-z_][\w:<>,\s\*&]*?[\s\*&]([A-Za-z_]\w*)\s*\(")
USING_NAMESPACE = re.compile(r"^using namespace (?!\S*_literals\b)")
NOT_DEFINITIONS = re.compile(r"^(return|using|namespace|TEST|TEST_F|TEST_P|INSTANTIATE|TYPED_TEST|"
                             r"MATCHER|else|if|for|while|switch|case|delete|new|throw|typedef|friend)\b")


def definitions(path):
    """Yields (name, local, line number) for each top-level function the file defines, and
    ("using namespace", None, line number) for each file-scope `using namespace`."""
    anon = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if USING_NAMESPACE.match(line):
            yield "using namespace", None, i + 1
            continue
        if line.startswith("namespace {"):
            anon += 1
            continue
        if line.startswith("}  // namespace") and line.rstrip() == "}  // namespace":
            anon = max(0, anon - 1)
            continue
        if not line or line[0] in " \t#/}{" or NOT_DEFINITIONS.match(line):
            continue
        m = FUNCTION.match(line)
        if not m:
            continue
        # A definition: its body opens on this line or a following one before any `;`.
        rest = "\n".join(lines[i:i + 12])
        brace, semi = rest.find("{"), rest.find(";")
        if brace < 0 or (0 <= semi < brace):
            continue
        yield m.group(2), anon > 0 or m.group(1) is not None, i + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    problems = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build"))
        seen = collections.defaultdict(list)  # name -> [(file, line, local)]
        for name in sorted(filenames):
            if not name.endswith(".cc"):
                continue
            path = os.path.join(dirpath, name)
            for fn, local, line in definitions(path):
                if local is None:
                    problems.append(f"{os.path.relpath(path, root)}:{line}: a file-scope `using namespace` "
                                    "reaches the next files of a unity batch")
                    continue
                seen[fn].append((os.path.relpath(path, root), line, local))
        for fn, where in sorted(seen.items()):
            files = {w[0] for w in where}
            if len(files) > 1 and any(w[2] for w in where):
                places = ", ".join(f"{f}:{l}{' (file-local)' if loc else ''}" for f, l, loc in where)
                problems.append(f"one name, several files of a folder (unity builds mix them): {fn}: {places}")
    for p in problems:
        print(f"check_unity: {p}")
    if problems:
        print(f"check_unity: {len(problems)} problem(s) (scripts/check_unity.py says why)")
        return 1
    print("check_unity: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
