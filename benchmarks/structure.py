"""The package's shape, for comparing two checkouts: import floors, the largest modules and functions.

* import floors: the number of modules on the longest import chain of tests/test_imports.py's graph (that
  checkout's own reading of its imports, so the figure follows its layout);
* the 5 largest modules of cvm_onnx/ and converters/ (lines) and the 5 largest functions (lines from ``def`` to
  the end of the body, methods and nested functions included);
* facts stated more than once: the lines of cvm_onnx/ and converters/ outside constants.py that spell out the
  int32 range, the float-exact ranges, tight(), the shift rounding or a ``"cvm.*"`` metadata key.
Run: python benchmarks/structure.py [CHECKOUT] (default: this repository)
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from pathlib import Path

RESTATED = {
    "int32 range": r"\(1 << 31\) - 1|-\(1 << 31\)|2 \*\* 31",
    "float-exact range": r"(?i)1 << 24\b.*(exact|float)|(exact|float).*1 << 24\b|1 << 53",
    "tight()": r"def tight\(",
    "shift rounding": r"1 << \(s - 1\)\)\) >> s|\(\(1 << s\) >> 1\)\) >> s|>> \(.*shift_bit - 1\)\) \+ 1\) >> 1|-\(-lo // 2\)",
    "metadata key literal": r"[\"']cvm\.(?!native[\"'])[a-z_.]+[\"']",
}


def import_graph(root: Path) -> dict[str, set[str]]:
    spec = importlib.util.spec_from_file_location("_imports_of_checkout", root / "tests" / "test_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.graph()


def floors(g: dict[str, set[str]]) -> tuple[int, list[str]]:
    """The longest chain of imports (the graph has no cycle): its length in modules, and the chain."""
    @functools.cache
    def longest(m: str) -> tuple[str, ...]:
        return (m, *max((longest(t) for t in g[m]), key=len, default=()))

    chain = max((longest(m) for m in sorted(g)), key=len)
    return len(chain), list(chain)


def sources(root: Path) -> list[Path]:
    return sorted(p for folder in ("cvm_onnx", "converters") for p in (root / folder).rglob("*.py")
                  if "converters" not in p.relative_to(root / folder).parts or folder == "converters")


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    n, chain = floors(import_graph(root))
    print(f"import floors: {n} ({' -> '.join(chain)})")
    files = sources(root)
    sizes = sorted(((len(p.read_text().splitlines()), p.relative_to(root)) for p in files), reverse=True)
    print("largest modules:", ", ".join(f"{p} {k}" for k, p in sizes[:5]))
    functions = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{p.relative_to(root)}:{node.name}"))
    functions.sort(reverse=True)
    print("largest functions:", ", ".join(f"{name} {k}" for k, name in functions[:5]))
    print(f"modules: {len(files)}, functions: {len(functions)}, "
          f"median function: {sorted(k for k, _ in functions)[len(functions) // 2]} lines")
    lines = [line for p in files if p.name != "constants.py" for line in p.read_text().splitlines()
             if not line.lstrip().startswith("#")]
    print("restated:", ", ".join(f"{what} {sum(bool(re.search(rx, line)) for line in lines)}"
                                 for what, rx in RESTATED.items()))


if __name__ == "__main__":
    main()
