"""Import order: no import circles inside the packages, and every module imports in a fresh interpreter.

Circles are broken by direction, not by lazy imports: workloads describe data and import no bench or
bundled-model loader; benches import workloads and pipelines; pipelines import no training code; the core
(``mmspec``) imports no modality package. So the checker counts every import, wherever it stands.

The graph (:func:`import_graph`) is built from the source with :mod:`ast`, never by importing:

- modules: every ``.py`` file of the packages mapped in ``pyproject.toml`` (``mmspec`` = ``mmspec/``,
  ``mmspec.vision`` = ``vision/``, ``mmspec.drivers`` = ``drivers/``, ``mmspec.image_ar`` = ``image_ar/``,
  ``mmspec.kernels`` = ``kernels/mmspec_kernels/``); a package is the module of its ``__init__.py``.
- edges: ALL ``import`` and ``from ... import`` statements, at module level and inside functions, classes,
  ``try`` and ``if`` blocks alike (a circle closed by a lazy import is still a circle); absolute
  ``mmspec.*`` names and relative ones (resolved against the importing module's package). Imports of
  anything outside the packages are ignored, and so are names built at run time (``importlib``).
- ``import a.b.c`` is an edge to ``a.b.c`` (the longest prefix that is a module of ours). The packages
  above it (``a``, ``a.b``) are not edges: by the time a submodule runs, its parents are already being
  imported, so they cannot start a circle of their own.
- ``from pkg import name`` is an edge to ``pkg.name`` when that is a submodule, else to ``pkg`` itself (its
  ``__init__``). So a package ``__init__`` that re-exports from its submodules has edges pkg -> sub, and a
  submodule that takes a name from its own package's ``__init__`` (``from mmspec.vision.workloads import X``
  inside ``workloads/docs.py``) closes a circle sub -> pkg -> sub: import it from the module defining it.
- a circle is a strongly connected component of more than one module, or a module importing itself.

Run ``python tests/test_import_order.py`` to print the circles.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "mmspec": ROOT / "mmspec",
    "mmspec.vision": ROOT / "vision",
    "mmspec.drivers": ROOT / "drivers",
    "mmspec.image_ar": ROOT / "image_ar",
    "mmspec.kernels": ROOT / "kernels" / "mmspec_kernels",
}

def modules() -> dict[str, Path]:
    """Every module of the packages: dotted name -> file (a package's name -> its ``__init__.py``)."""
    found: dict[str, Path] = {}
    roots = sorted(PACKAGES.items(), key=lambda kv: -len(kv[0]))
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(p in ("assets", "__pycache__") or not p.isidentifier() for p in parts):
                continue
            name = ".".join([pkg, *parts])
            # a folder mapped to its own package (mmspec/ holds no vision/, but be safe) belongs to that one
            owner = next(p for p, f in roots if path.is_relative_to(f))
            if owner == pkg:
                found[name] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (``None`` for outside names)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that ``name`` (at ``path``) imports anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if _is_package(path) else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "mmspec" or alias.name.startswith("mmspec."):
                    target = _resolve(alias.name, known)
                    if target:
                        out.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == "mmspec" or source.startswith("mmspec.")):
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                target = sub if sub in known else _resolve(source, known)
                if target:
                    out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and modules importing themselves (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:  # iterative would be longer; the graph is a few hundred modules deep at most
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    """One circle's modules and the edges among them."""
    members = set(component)
    edges = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "  " + ", ".join(component) + "\n" + "\n".join(edges)


def test_no_import_circles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(graph, c) for c in found)


def test_bench_hooks_come_from_the_bench_side():
    """The registered workloads carry mmspec bench's hooks, though their modules import no bench."""
    from mmspec.workloads import get_workload

    assert get_workload("testbed-docs").own_systems == ("hierarchical",)
    driving = get_workload("driving")
    assert driving.plain_pipeline and driving.plain_systems and type(driving).__name__ == "DrivingBenchWorkload"


def test_checker_sees_lazy_and_relative_imports(tmp_path):
    """The checker itself: a lazy relative import closes a circle; a package re-export of a submodule does not."""
    known = {"mmspec.x": tmp_path / "x.py", "mmspec.y": tmp_path / "y.py", "mmspec.p": tmp_path / "p" / "__init__.py",
             "mmspec.p.s": tmp_path / "p" / "s.py"}
    (tmp_path / "p").mkdir()
    known["mmspec.x"].write_text("from .y import f\n")
    known["mmspec.y"].write_text("def f():\n    from mmspec import x\n    return x\n")
    known["mmspec.p"].write_text("from .s import g\n")
    known["mmspec.p.s"].write_text("from mmspec.p import s as _s\nfrom .. import y\ng = 1\n")
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert graph["mmspec.y"] == {"mmspec.x"} and graph["mmspec.p.s"] == {"mmspec.p.s", "mmspec.y"}
    assert cycles(graph) == [["mmspec.p.s"], ["mmspec.x", "mmspec.y"]]


def _import_all(names: list[str]) -> subprocess.CompletedProcess:
    code = (
        "import importlib, sys\n"
        "skipped = []\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as e:\n"
        "        # only an optional GPU-only dependency may be missing (triton, CUDA); anything else is a bug\n"
        "        if not any(k in str(e).lower() for k in ('triton', 'cuda')):\n"
        "            raise\n"
        "        skipped.append(f'{name}: {e}')\n"
        "print('\\n'.join(skipped))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["alphabetical", "reverse"])
def test_every_module_imports_in_a_fresh_interpreter(order):
    names = sorted(n for n in modules() if not n.endswith("__main__"))
    if order == "reverse":
        names.reverse()
    result = _import_all(names)
    assert result.returncode == 0, result.stderr[-4000:]
    if result.stdout.strip():
        print("skipped (GPU-only dependency missing):\n" + result.stdout)


if __name__ == "__main__":
    g = import_graph()
    found = cycles(g)
    print(f"{len(g)} modules, {sum(map(len, g.values()))} edges, {len(found)} circles")
    for c in found:
        print(describe(g, c))
