"""The package's import graph: no cycle, the converters below the front door, the same graph from a checkout.

The graph is read from the source with ``ast`` (every import statement, those inside functions too): an edge
A -> B for each module B that importing A runs, including the ``__init__`` of each package on the way to B that
is not already being imported as A's own ancestor. ``converters/`` is the subpackage ``cvm_onnx.converters``.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The modules above the converters (the front door and what is built on it): the converters never import them.
FRONT = {"cvm_onnx", "cvm_onnx.api", "cvm_onnx.cli", "cvm_onnx.report", "cvm_onnx.verify", "cvm_onnx.view"}
#: The converters' faces to the core: the core imports the converters only through these.
FACES = {"cvm_onnx.converters", "cvm_onnx.converters.to_onnx", "cvm_onnx.converters.from_onnx"}


def modules() -> dict[str, Path]:
    found = {}
    for prefix, folder in (("cvm_onnx", ROOT / "cvm_onnx"), ("cvm_onnx.converters", ROOT / "converters")):
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules that ``import name`` runs directly: each module it names, and each package on the way
    to one that is not ``name``'s own ancestor (an ancestor is already being imported: its names are read only
    when the import names it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for a in node.names:
                targets.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    out = {t for t in targets if t in known and t != name}  # an ancestor's name read: it must have run first
    for t in targets:
        parts = t.split(".")
        for k in range(1, len(parts)):
            step = ".".join(parts[:k])
            if step in known and not (name + ".").startswith(step + "."):
                out.add(step)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1 or v in edges[v]:
                found.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_reader_sees_every_module():
    g = graph()
    assert {"cvm_onnx", "cvm_onnx.api", "cvm_onnx.converters.to_onnx.export",
            "cvm_onnx.converters.from_onnx.importer"} <= set(g)
    assert "cvm_onnx.constants" in g["cvm_onnx.converters.to_onnx.export"]


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_a_cycle_is_found():
    """The check itself: the package's own __init__ -> api -> exporter chain closed by one import back."""
    g = graph()
    g["cvm_onnx.converters.to_onnx.export"] = g["cvm_onnx.converters.to_onnx.export"] | {"cvm_onnx"}
    (scc,) = cycles(g)
    assert {"cvm_onnx", "cvm_onnx.api", "cvm_onnx.converters.to_onnx.export"} <= set(scc)


def test_converters_stay_below_the_front_door():
    g = graph()
    up = {(m, t) for m, ts in g.items() if m.startswith("cvm_onnx.converters") for t in ts & FRONT}
    assert up == set()


def test_core_reaches_converters_through_their_faces():
    g = graph()
    inside = {(m, t) for m, ts in g.items() if not m.startswith("cvm_onnx.converters")
              for t in ts if t.startswith("cvm_onnx.converters") and t not in FACES}
    assert inside == set()


def test_a_checkout_imports_without_an_install():
    """From the source tree alone (no editable finder, no installed copy: site-packages read as a plain folder,
    its .pth files unread), ``cvm_onnx.converters`` is the top-level converters/ folder."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]]))
    code = "import cvm_onnx; print(cvm_onnx.converters.to_onnx.__file__)"
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.splitlines()[0]) == ROOT / "converters" / "to_onnx" / "__init__.py"
