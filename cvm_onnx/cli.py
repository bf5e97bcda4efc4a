"""The ``cvm-onnx`` command: a thin shell over the library (see docs/cli.md for commands and exit codes)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from . import api
from .errors import CVMError, FormatError

INTERNAL_ERROR = 70


def read_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise FormatError(f"cannot read the input array: {e}", where=path) from None


def write_npz(path: str, names: list[str], values: list[np.ndarray]) -> None:
    arrays: dict[str, np.ndarray] = {}
    for name, value in zip(names, values):
        key = name if name not in arrays else f"{name}_{len(arrays)}"
        arrays[key] = np.asarray(value, dtype=np.int32)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _warn(problems) -> None:
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)


def cmd_validate(args) -> int:
    model = api.load(args.model, args.params)
    _warn(model.warnings)
    g = model.graph
    print(f"ok: {args.model}: {sum(not n.is_variable for n in g.nodes)} op nodes, {len(g.params)} params, "
          f"valid for the CVM runtime")
    return 0


def cmd_info(args) -> int:
    model = api.load(args.model, args.params)
    g = model.graph
    print(f"model: {args.model}")
    for i in g.inputs:
        t = g.nodes[i].outputs[0]
        print(f"input  {g.nodes[i].name}: shape {t.shape}, precision {t.precision}")
    for h in g.heads:
        t = g.type_of(h)
        print(f"output {g.nodes[h.node].name}: shape {t.shape}, precision {t.precision}")
    nbytes = sum(v.nbytes for v in g.params.values())
    print(f"params: {len(g.params)} arrays, {sum(v.size for v in g.params.values())} values, {nbytes} bytes")
    print("ops:")
    for op, n in g.op_counts().items():
        print(f"  {op:<22}{n:>6}")
    _warn(model.warnings)
    return 0


def cmd_convert(args) -> int:
    api.convert(args.source, args.output, params=args.params, inline=args.inline,
                input_precision=args.input_precision)
    print(f"wrote {args.output}")
    return 0


def cmd_run(args) -> int:
    data = read_npy(args.input)
    if api.is_onnx(args.model):
        from .runtime import run_model

        names, outs = run_model(api.load_onnx(args.model), data, provider=args.provider)
    else:
        model = api.load(args.model, args.params)
        _warn(model.warnings)
        outs = api.run_cvm(model.graph, data)
        names = [model.graph.nodes[h.node].name for h in model.graph.heads]
    write_npz(args.output, names, outs)
    print(f"wrote {args.output}: " + ", ".join(f"{n} {tuple(o.shape)}" for n, o in zip(names, outs)))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cvm-onnx", description="CVM models to ONNX and back, bit-exact.")
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = p.add_subparsers(dest="command", required=True)

    def model_cmd(name, fn, help, aliases=()):
        c = sub.add_parser(name, help=help, aliases=list(aliases))
        c.add_argument("model", help="CVM model directory (symbol + params), a symbol file, or an .onnx file")
        c.add_argument("--params", help="params file when MODEL is a symbol file")
        c.set_defaults(fn=fn)
        return c

    model_cmd("validate", cmd_validate, "check a CVM model against the runtime's load-time rules", ["check"])
    model_cmd("info", cmd_info, "ops, params, inputs and outputs of a CVM model")
    r = model_cmd("run", cmd_run, "run a CVM model (reference executor) or an ONNX model (onnxruntime)")
    r.add_argument("--input", required=True, help=".npy holding the input data (int8 or int32)")
    r.add_argument("--output", required=True, help=".npz to write, one int32 array per output in order")
    r.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="onnxruntime provider (ONNX models)")
    c = sub.add_parser("convert", help="convert a CVM model to ONNX, or an ONNX model to CVM")
    c.add_argument("source", help="CVM model directory (or a symbol file with --params), or an .onnx file")
    c.add_argument("-o", "--output", required=True,
                   help="the .onnx file to write, or for an .onnx source the CVM model directory")
    c.add_argument("--params", help="params file when SOURCE is a symbol file")
    c.add_argument("--inline", action="store_true", help="write the flat form, every function inlined")
    c.add_argument("--input-precision", type=int, default=8, metavar="N",
                   help="bits of the ONNX model's input values, |x| <= 2^(N-1)-1 (default 8; the runtime clamps "
                        "its input to them)")
    c.set_defaults(fn=cmd_convert)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except CVMError as e:
        for problem in e.problems:
            print(f"{e.kind}: {problem}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # a bug of ours: say so briefly unless debugging
        if args.debug:
            raise
        print(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)", file=sys.stderr)
        return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
