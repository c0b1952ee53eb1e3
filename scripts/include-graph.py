#!/usr/bin/env python3
"""The module graph of sluice's sources, from their #include lines, and its cycles.

Each source file belongs to the module of its folder, each public header of include/sluice/ to the
module it declares, each private header (*_impl.h) to its folder's module. An #include of a
header of another module is an edge; the script prints every module's edges and line count, and
exits 1 when the graph has a cycle (naming it), 0 otherwise.

Usage: scripts/include-graph.py [--dot]   (run from anywhere in the tree)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Folders in the order they are matched (the longest first), and the module each holds.
FOLDERS = [
    ("gateway/http/", "http"),
    ("gateway/api/", "api"),
    ("gateway/", "api"),  # what is left of the old gateway folder
    ("admission/", "admission"),
    ("fleet/", "fleet"),
    ("usage/", "usage"),
    ("config/", "config"),
    ("server/", "server"),
    ("scheduler/", "scheduler"),
    ("worker/", "worker"),
    ("kernels/", "kernels"),
    ("common/", "common"),
]

# Public headers and the module that implements them.
PUBLIC = {
    "common.h": "common",
    "kernels.h": "kernels",
    "worker.h": "worker",
    "sched.h": "scheduler",
    "admission.h": "admission",
    "fleet.h": "fleet",
    "usage.h": "usage",
    "config.h": "config",
    "http.h": "http",
    "api.h": "api",
    "server.h": "server",
}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def module_of(path):
    for prefix, mod in FOLDERS:
        if path.startswith(prefix):
            return mod
    return None


def sources():
    for top in [p for p, _ in FOLDERS if "/" not in p.rstrip("/")] + ["gateway/"]:
        base = os.path.join(ROOT, top)
        for dirpath, _, names in os.walk(base):
            for n in sorted(names):
                if n.endswith((".c", ".h", ".cu", ".cuh")):
                    full = os.path.join(dirpath, n)
                    yield os.path.relpath(full, ROOT)
    inc = os.path.join(ROOT, "include", "sluice")
    for n in sorted(os.listdir(inc)):
        yield os.path.join("include", "sluice", n)


def main():
    files = sorted(set(sources()))
    by_name = {}  # private header name -> module
    for f in files:
        if not f.startswith("include/"):
            by_name.setdefault(os.path.basename(f), module_of(f))
    edges, lines = {}, {}
    for f in files:
        mod = PUBLIC.get(os.path.basename(f)) if f.startswith("include/") else module_of(f)
        if mod is None:
            continue
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read().splitlines()
        if not f.startswith("include/") and f.endswith((".c", ".cu")):
            lines[mod] = lines.get(mod, 0) + len(text)
        for line in text:
            m = INCLUDE.match(line)
            if not m:
                continue
            name = m.group(2)
            if name.startswith("sluice/"):
                to = PUBLIC.get(name[len("sluice/"):])
            elif m.group(1) == '"':
                to = by_name.get(os.path.basename(name))
            else:
                to = None  # a system or third-party header
            if to and to != mod:
                edges.setdefault(mod, {}).setdefault(to, set()).add(f)
    mods = sorted(set(lines) | set(edges) | {t for e in edges.values() for t in e})
    if "--dot" in sys.argv:
        print("digraph sluice {")
        for a in mods:
            for b in sorted(edges.get(a, {})):
                print(f'  "{a}" -> "{b}";')
        print("}")
    else:
        for a in mods:
            outs = ", ".join(sorted(edges.get(a, {}))) or "-"
            print(f"{a:10} {lines.get(a, 0):6} lines  -> {outs}")
    # Cycles: a depth-first search that reports the first back edge it meets.
    state, stack = {}, []

    def visit(a):
        state[a] = 1
        stack.append(a)
        for b in sorted(edges.get(a, {})):
            if state.get(b) == 1:
                cyc = stack[stack.index(b):] + [b]
                why = ", ".join(sorted(edges[a][b]))
                print(f"cycle: {' -> '.join(cyc)} (the last edge from {why})")
                return True
            if state.get(b) is None and visit(b):
                return True
        stack.pop()
        state[a] = 2
        return False

    for a in mods:
        if state.get(a) is None and visit(a):
            return 1
    print("no include cycle between modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
