#!/usr/bin/env python3
"""check_layout.py ROOT: the layout rules of docs/architecture.md, checked.

1. Headers are included by their path from the repository root
   ("runtime/plan.h"): every quoted #include names a folder.
2. Each folder includes only the folders below it:
     common   -
     kernels  common
     proto    common
     runtime  kernels, common
     convert  runtime, kernels, proto, common
     present  proto, common
     executor convert, runtime, present, kernels, proto, common
     tools    convert, runtime, present, kernels, proto, common
     control  convert, runtime, present, kernels, proto, common
     client   present, proto, common
   and only control/ includes libuv (<uv.h>).
3. The module graph has no cycle: a module is a source file and its header
   (control/server.c + control/server.h); an edge is an #include of another
   module's header. Each cycle found is printed.
4. A module's header declares only what its own source defines: a function
   declared in X.h is defined in X.c (or X.cu), so no header lets one module
   call into another behind the include graph's back (a handler reaching
   into the server, the server into main). Contract headers that many
   sources implement are named in CONTRACTS.
Exits 1 on any violation, printing every one; 0 and a summary otherwise.
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else "."
ALLOWED = {
    "common": set(),
    "kernels": {"common"},
    "proto": {"common"},
    "runtime": {"kernels", "common"},
    "convert": {"runtime", "kernels", "proto", "common"},
    "present": {"proto", "common"},
    "executor": {"convert", "runtime", "present", "kernels", "proto", "common"},
    "tools": {"convert", "runtime", "present", "kernels", "proto", "common"},
    "control": {"convert", "runtime", "present", "kernels", "proto", "common"},
    "client": {"present", "proto", "common"},
}
# Headers whose functions are defined by several sources on purpose.
CONTRACTS = {
    "kernels/backend.h",   # the backend contract: dtype.c, cpu/, the loader
    "kernels/cpu/cpu_internal.h",  # the cpu backend's files share it
    "kernels/cuda/cuda_internal.h",
    "kernels/ref_blas/cblas.h",    # OpenBLAS's interface, for a host without it
}
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)

errors = []
graph = {}
n_files = 0
for folder in sorted(ALLOWED):
    top = os.path.join(ROOT, folder)
    for dirpath, _, names in os.walk(top):
        for name in sorted(names):
            if not name.endswith((".c", ".h", ".cu")):
                continue
            path = os.path.relpath(os.path.join(dirpath, name), ROOT)
            n_files += 1
            module = os.path.splitext(path)[0]
            graph.setdefault(module, set())
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                text = f.read()
            for kind, inc in INCLUDE.findall(text):
                if kind == "<":
                    if inc == "uv.h" and folder != "control":
                        errors.append(f"{path}: includes <uv.h>; only control/ uses libuv")
                    continue
                if "/" not in inc:
                    errors.append(f'{path}: #include "{inc}" is not by path from the repository root')
                    continue
                dep = inc.split("/")[0]
                if dep != folder and dep not in ALLOWED[folder]:
                    errors.append(f"{path}: includes {inc}, but {folder}/ may include only "
                                  f"{', '.join(sorted(ALLOWED[folder])) or 'itself'}")
                target = os.path.splitext(inc)[0]
                if target != module and os.path.exists(os.path.join(ROOT, inc)):
                    graph[module].add(target)

# Rule 4: where is each function declared in a header defined?
DECL = re.compile(r'^(?!static|typedef|#|\s)[A-Za-z_][\w \t*]*?\b([a-z_][a-z0-9_]*)\s*\([^;{]*\)\s*'
                  r'(?:__attribute__\s*\(\(.*?\)\)\s*)?;', re.M | re.S)
sources = {}
for module in graph:
    for ext in (".c", ".cu"):
        p = os.path.join(ROOT, module + ext)
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                sources[module + ext] = f.read()
for module in sorted(graph):
    header = module + ".h"
    if header in CONTRACTS or not os.path.exists(os.path.join(ROOT, header)):
        continue
    with open(os.path.join(ROOT, header), encoding="utf-8") as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    for name in DECL.findall(text):
        defn = re.compile(r"\b" + name + r"\s*\([^;{]*\)\s*\{", re.S)
        where = [src for src, body in sources.items() if defn.search(body)]
        if not where:
            continue  # defined elsewhere (generated, or only declared): not this rule's
        if not any(os.path.splitext(w)[0] == module for w in where):
            errors.append(f"{header}: declares {name}(), defined in {', '.join(where)}")

# Cycles: Tarjan's strongly connected components; any with two or more
# modules is a cycle.
index, low, on, stack, sccs = {}, {}, set(), [], []
sys.setrecursionlimit(10000)


def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


for v in sorted(graph):
    if v not in index:
        visit(v)
for comp in sccs:
    errors.append("module cycle: " + " <-> ".join(comp))

for e in errors:
    print(e)
edges = sum(len(s) for s in graph.values())
if errors:
    print(f"layout: {len(errors)} violation(s) in {n_files} files")
    sys.exit(1)
print(f"layout: {n_files} files, {len(graph)} modules, {edges} include edges, no cycle")
