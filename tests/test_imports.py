"""The package's import graph: the folders are layers and every import points down, no cycle, the same graph
from a checkout.

The graph is read from the source with ``ast`` (every import statement, those inside functions too): an edge
A -> B for each module B that importing A runs, including the ``__init__`` of each package on the way to B that
is not already being imported as A's own ancestor. The walk starts at cvm_onnx/ alone and follows its symbolic
link cvm_onnx/converters -> ../converters, as a static tool does.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The layers, lowest first: a module may import its own folder and any folder of a lower layer, never a higher
#: one. The longest prefix names a module's layer.
LAYERS = [
    ("cvm_onnx.core.constants", "cvm_onnx.core.errors", "cvm_onnx.core.attrs", "cvm_onnx.core.graph"),
    ("cvm_onnx.core.format",),
    ("cvm_onnx.core.ops",),
    ("cvm_onnx.core",),
    ("cvm_onnx.native",),
    ("cvm_onnx.serving",),
    ("cvm_onnx.converters.to_onnx",),
    ("cvm_onnx.converters.from_onnx", "cvm_onnx.converters"),
    ("cvm_onnx.runtime",),
    ("cvm_onnx.app",),
    ("cvm_onnx",),
]


def floor(module: str) -> int:
    """The layer of ``module``: the index in LAYERS of its longest matching prefix."""
    best, found = -1, None
    for k, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), k
    return found


def modules() -> dict[str, Path]:
    found = {}
    folder = ROOT / "cvm_onnx"
    for here, _, files in os.walk(folder, followlinks=True):
        for f in files:
            if f.endswith(".py"):
                parts = list((Path(here) / f).relative_to(folder).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(["cvm_onnx", *parts])] = Path(here) / f
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
    assert {"cvm_onnx", "cvm_onnx.app.api", "cvm_onnx.converters.to_onnx.export",
            "cvm_onnx.converters.from_onnx.importer"} <= set(g)
    assert "cvm_onnx.core.constants" in g["cvm_onnx.converters.to_onnx.export"]
    assert all(floor(m) is not None for m in g)


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_a_cycle_is_found():
    """The check itself: the package's own __init__ -> api -> exporter chain closed by one import back."""
    g = graph()
    g["cvm_onnx.converters.to_onnx.export"] = g["cvm_onnx.converters.to_onnx.export"] | {"cvm_onnx"}
    (scc,) = cycles(g)
    assert {"cvm_onnx", "cvm_onnx.app.api", "cvm_onnx.converters.to_onnx.export"} <= set(scc)


def upward(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The edges that point to a higher layer than their source's."""
    return {(m, t) for m, ts in g.items() for t in ts if floor(t) > floor(m)}


def test_every_import_points_down_the_layers():
    assert upward(graph()) == set()


@pytest.mark.parametrize("source, target", [
    ("cvm_onnx.core.format.symbol", "cvm_onnx.core.ops.registry"),      # format knows no ops
    ("cvm_onnx.core.executor", "cvm_onnx.native"),                      # the core knows no native library
    ("cvm_onnx.native.cpu", "cvm_onnx.converters.to_onnx.export"),      # nor the converters
    ("cvm_onnx.converters.to_onnx.nn", "cvm_onnx.converters.from_onnx.importer"),
    ("cvm_onnx.converters.from_onnx.importer", "cvm_onnx.runtime.sessions"),
    ("cvm_onnx.runtime.bulk", "cvm_onnx.app.api"),
])
def test_an_upward_import_is_found(source, target):
    """The check itself: one planted import against the direction is reported."""
    g = graph()
    g[source] = g[source] | {target}
    assert upward(g) == {(source, target)}


FROM_ONNX = "cvm_onnx.converters.from_onnx"
#: The import rule modules of from_onnx: leaves, which take their shared helpers from ``emit`` (and the registry,
#: context, checks) and never from one another. ``quantized`` is a package whose modules import only those before
#: them in QUANTIZED.
RULE_MODULES = ("elemwise", "nn", "transform", "reduce", "roundtrip", "quantized")
QUANTIZED = ("values", "qdq", "products", "elementwise", "moves", "norm", "qoperator", "edges", "chains")


def rule_module(module: str) -> str | None:
    """The rule module (or package) of from_onnx that ``module`` is, or is in."""
    return next((r for r in RULE_MODULES if module == f"{FROM_ONNX}.{r}" or module.startswith(f"{FROM_ONNX}.{r}.")),
                None)


def between_rules(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The imports from one rule module to another, and those in ``quantized`` to a module not before it."""
    inner = [f"{FROM_ONNX}.quantized.{q}" for q in QUANTIZED]
    out = set()
    for m, ts in g.items():
        for t in ts:
            if rule_module(m) and rule_module(t) and rule_module(m) != rule_module(t):
                out.add((m, t))
            elif m in inner and t in inner and inner.index(t) >= inner.index(m):
                out.add((m, t))
    return out


def test_rule_modules_import_no_other_rule_module():
    g = graph()
    assert {f"{FROM_ONNX}.{r}" for r in RULE_MODULES} <= set(g)
    assert between_rules(g) == set()


@pytest.mark.parametrize("source, target", [
    (f"{FROM_ONNX}.nn", f"{FROM_ONNX}.transform"),
    (f"{FROM_ONNX}.quantized.products", f"{FROM_ONNX}.nn"),
    (f"{FROM_ONNX}.quantized.products", f"{FROM_ONNX}.quantized.qoperator"),
])
def test_an_import_between_rules_is_found(source, target):
    """The check itself: one planted import from a rule module to another (or up ``quantized``) is reported."""
    g = graph()
    g[source] = g[source] | {target}
    assert between_rules(g) == {(source, target)}


def test_a_checkout_imports_without_an_install():
    """From the source tree alone (no editable finder, no installed copy: site-packages read as a plain folder,
    its .pth files unread), ``cvm_onnx.converters`` is the top-level converters/ folder."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]]))
    code = "import cvm_onnx.converters.to_onnx as t; print(t.__file__)"
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.splitlines()[0]).resolve() == ROOT / "converters" / "to_onnx" / "__init__.py"


HEAVY = ("numpy", "onnx", "onnxruntime", "ray", "rich", "sympy", "threadpoolctl")


def loaded_by(*argv: str) -> set[str]:
    """The heavy modules that ``cvm-onnx ARGV`` has imported when it returns (run in a fresh interpreter)."""
    code = ("import contextlib, io, sys\nfrom cvm_onnx.app.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()): code = main({list(argv)!r})\n"
            f"assert code == 0, code\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_help_imports_nothing_heavy():
    """`cvm-onnx --help` (and the package itself) starts without numpy, onnx, onnxruntime, Ray, rich or sympy."""
    assert loaded_by("--help") == set()
    assert loaded_by("run", "--help") == set()


def test_info_of_a_cvm_model_needs_numpy_alone():
    """`info` of a CVM model reads and validates it with numpy; onnx and onnxruntime load only for ONNX files
    and the native library's status."""
    assert loaded_by("info", "models/digits_cnn") == {"numpy"}
    assert "onnxruntime" not in loaded_by("info", "models/detection")
