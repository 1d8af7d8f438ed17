"""The package's layering, read from the source (ast: module- and function-level imports; ``TYPE_CHECKING``
blocks aside) and from what a first call really loads.

* Data flows one way: the run time (``api``, ``integrations``, ``kernels``, ``db``, ``hw``) never imports the
  tuner (``tuning``) or the static phase (``static``, ``isa_tools``), except the one stated run-time build check
  (``api.build_check``, which reads a compiled kernel's profile) and the exceptions listed below with their reason.
* No import cycle anywhere in ``rocmflash`` or ``isa_tools``, counting the imports inside functions: a module that
  two others need lives below both (e.g. ``api.clear_hooks``, ``api.varlen_checks``), never behind an import
  trick the graph cannot see.
* Each kernel family is one package under ``kernels/``.
* The first decode-shaped ``flash_attn_with_kvcache`` / ``attention`` call loads none of ``tuning``, ``static``
  or ``isa_tools``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("rocmflash", "isa_tools")
RUN_TIME = ("rocmflash.api", "rocmflash.integrations", "rocmflash.kernels", "rocmflash.db", "rocmflash.hw")
OFFLINE = ("rocmflash.tuning", "rocmflash.static", "isa_tools")
#: run-time -> offline imports that stay, each with its reason (may only shrink)
ALLOWED_OFFLINE = {
    # the run-time build check: reads a compiled kernel's profile (isa_tools on AMD) and compares the record
    ("rocmflash.api.build_check", "rocmflash.static.profile"),
    ("rocmflash.api.build_check", "isa_tools"),
    ("rocmflash.api.build_check", "isa_tools.summary"),
    ("rocmflash.api.build_check", "isa_tools.occupancy"),
    # ... and cross-compiles an unmeasured varlen-backward config once before it is served, judged by the pruner's
    # build rules (``usable_config``)
    ("rocmflash.api.build_check", "rocmflash.static.compile"),
    ("rocmflash.api.build_check", "rocmflash.static.prune"),
}
#: packages that must have no import cycle at all
ACYCLIC = ("rocmflash.kernels", "rocmflash.db", "rocmflash.hw", "isa_tools")
#: the shared helpers every kernel family uses; every other kernel module lives in its family's package
KERNEL_HELPERS = {"__init__", "build", "common", "demo", "error_swap", "error_words", "launch", "masks"}
KERNEL_FAMILIES = {"forward", "fp8", "backward", "decode", "varlen"}


def _modules() -> dict:
    found = {}
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    found[".".join(parts)] = path
    return found


def _import_graph() -> dict:
    """``{module: {modules it imports}}``, each import resolved to the longest known module name."""
    modules = _modules()
    graph = defaultdict(set)

    def resolve(name):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in modules:
                return ".".join(parts[:i])
        return None

    for module, path in modules.items():
        is_pkg = path.endswith("__init__.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        stack = [tree]
        while stack:
            node = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    stack.extend(child.orelse)
                    continue
                targets = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        here = module.split(".") if is_pkg else module.split(".")[:-1]
                        here = here[:len(here) - (child.level - 1)]
                        base = ".".join(here + ([child.module] if child.module else []))
                    subs = [f"{base}.{a.name}" for a in child.names]
                    # `from pkg import submodule` depends on the submodule, not on the package's own code
                    targets = subs if all(s in modules for s in subs) else [base] + subs
                for target in targets:
                    dep = resolve(target)
                    if dep and dep != module:
                        graph[module].add(dep)
                stack.append(child)
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(_modules()):
        if v not in index:
            visit(v)
    return found


def _inside(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_run_time_never_imports_the_tuner_or_the_static_phase():
    graph = _import_graph()
    edges = {(a, b) for a, deps in graph.items() for b in deps
             if _inside(a, RUN_TIME) and _inside(b, OFFLINE)}
    assert edges <= ALLOWED_OFFLINE, f"run time -> tuner/static imports not allowed: {sorted(edges - ALLOWED_OFFLINE)}"


def test_no_import_cycle_inside_the_lower_floors():
    for component in _cycles(_import_graph()):
        inner = sorted(m for m in component if _inside(m, ACYCLIC))
        assert not inner, f"import cycle through {inner}: {sorted(component)}"


#: the modules in an import cycle today: none (issue 50 broke the last ones; a new cycle is moved apart, not listed)
KNOWN_CYCLE_MODULES: set = set()


def test_no_import_cycle():
    cycles = [sorted(component) for component in _cycles(_import_graph())]
    assert not cycles, "modules in an import cycle (module- and function-level imports): " + \
        "; ".join(str(cycle) for cycle in cycles)


def test_each_kernel_family_is_one_package():
    kernels = os.path.join(ROOT, "rocmflash", "kernels")
    flat = {name[:-3] for name in os.listdir(kernels) if name.endswith(".py")}
    assert flat <= KERNEL_HELPERS, f"kernel modules outside a family package: {sorted(flat - KERNEL_HELPERS)}"
    packages = {name for name in os.listdir(kernels)
                if os.path.isfile(os.path.join(kernels, name, "__init__.py"))}
    assert packages == KERNEL_FAMILIES


_FIRST_CALLS = r"""
import sys, torch
import rocmflash
torch.manual_seed(0)
B, S, Hkv, G, D = 1, 300, 2, 2, 16
q = torch.randn(B, 1, Hkv * G, D, dtype=torch.float16)
k = torch.randn(B, S, Hkv, D, dtype=torch.float16)
v = torch.randn(B, S, Hkv, D, dtype=torch.float16)
lens = torch.full((B,), 280, dtype=torch.int32)
out = rocmflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
ref = torch.nn.functional.scaled_dot_product_attention(
    q.float().transpose(1, 2), k[:, :280].float().transpose(1, 2).repeat_interleave(G, 1),
    v[:, :280].float().transpose(1, 2).repeat_interleave(G, 1)).transpose(1, 2)
assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
rocmflash.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
print(" ".join(sorted(m for m in sys.modules if m.startswith(("rocmflash", "isa_tools")))))
"""


def test_a_first_decode_call_loads_no_tuner():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _FIRST_CALLS], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = done.stdout.split()
    assert "rocmflash.kernels.decode.host" in loaded  # the call really ran the decode kernel's host side
    offline = [m for m in loaded if _inside(m, OFFLINE)]
    assert not offline, f"a first decode call loaded the tuner / static phase: {offline}"


def test_the_lookup_modules_never_shadow_the_database_s_lookup():
    """``rocmflash.db.lookup`` is the forward's lookup function: no submodule of ``rocmflash.db`` may take the
    name (importing it would rebind the package attribute to the module)."""
    import importlib

    import rocmflash.db as db

    for name in ("decode", "backward", "varlen", "varlen_bwd"):
        importlib.import_module(f"rocmflash.db.lookups.{name}")
    assert callable(db.lookup) and db.lookup.__module__ == "rocmflash.db"
