"""The ``cvm-onnx`` command: a thin shell over the library (see docs/cli.md for commands and exit codes)."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np

from cvm_onnx import native
from cvm_onnx.app import api
from cvm_onnx.core.constants import FLOAT_IO
from cvm_onnx.core.errors import CVMError, FormatError, RuntimeFailure, UnsupportedError
from cvm_onnx.core.format.edges import parse_edges
from cvm_onnx.core.format.model_dir import replace_file
from cvm_onnx.core.format.npy import read_npy
from cvm_onnx.runtime.bulk import CHUNK

# Exit codes besides the error families' (errors.py): sysexits' EX_USAGE (argparse's own 2 is taken by format
# errors) and EX_SOFTWARE, then the shell's 128 + signal number.
USAGE_ERROR = 64
INTERNAL_ERROR = 70
INTERRUPTED = 130
BROKEN_PIPE = 141


def line(text: object) -> str:
    """``text`` on one line: control characters (newlines, terminal escapes in hostile names) shown escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def say(text: object) -> None:
    print(line(text))


def complain(text: object) -> None:
    print(line(text), file=sys.stderr)


def _warn(problems) -> None:
    for p in problems:
        complain(f"warning: {p}")


def cmd_validate(args) -> int:
    if api.is_onnx(args.model):
        model = api.validate(api.import_onnx(args.model))
        what = "imports as a CVM model"
    else:
        model = api.load(args.model, args.params)
        what = ""
    _warn(model.warnings)
    g = model.graph
    say(f"ok: {args.model}: {what + ' of ' if what else ''}{sum(not n.is_variable for n in g.nodes)} op nodes, "
        f"{len(g.params)} params, valid for the CVM runtime")
    return 0


def cmd_info(args) -> int:
    if api.is_onnx(args.model):
        from .onnx_info import describe

        for text in [f"model: {args.model}", *describe(api.load_onnx(args.model))]:
            say(text)
        return 0
    model = api.load(args.model, args.params)
    g = model.graph
    say(f"model: {args.model}")
    for i in g.inputs:
        t = g.nodes[i].outputs[0]
        say(f"input  {g.nodes[i].name}: shape {t.shape}, precision {t.precision}")
    for h in g.heads:
        t = g.type_of(h)
        say(f"output {g.nodes[h.node].name}: shape {t.shape}, precision {t.precision}")
    nbytes = sum(v.nbytes for v in g.params.values())
    say(f"params: {len(g.params)} arrays, {sum(v.size for v in g.params.values())} values, {nbytes} bytes")
    say("ops:")
    for op, n in g.op_counts().items():
        say(f"  {op:<22}{n:>6}")
    if model.edges is not None:
        from .onnx_info import edge_lines

        for text in edge_lines(model.edges, "quantization.json", "its export on onnxruntime alone takes and gives "
                               "the integers"):
            say(text)
    if native_ops := sorted(set(g.op_counts()) & set(native.ATTRS)):
        say(f"native ops: {', '.join(native_ops)}: on onnxruntime they run in the custom-op library; "
            f"{native.status()}")
    _warn(model.warnings)
    return 0


def cmd_convert(args) -> int:
    if args.triton_repo is not None:
        return convert_triton(args)
    if args.output is None:
        args.usage.print_usage(sys.stderr)
        complain("cvm-onnx convert: error: the following arguments are required: -o/--output (or --triton-repo)")
        return USAGE_ERROR
    if args.float_io and api.is_onnx(args.source):
        complain(f"cvm-onnx convert: --float-io exports a quantized CVM model; {args.source} is an ONNX file")
        return USAGE_ERROR
    if (args.report or args.verify) and not api.is_onnx(args.source):
        return convert_checked(args)
    imported = api.convert(args.source, args.output, params=args.params, inline=args.inline,
                           input_precision=args.input_precision, batch=args.batch, optimize=args.optimize,
                           outputs=args.outputs, provider=args.provider,
                           float_io=args.float_io, two_part=args.two_part)
    if imported is not None and args.report:
        from .report import import_markdown

        write_report(args.report, import_markdown(args.source, args.output, imported))
    say(f"wrote {args.output}" + (" (quantized: float edges in quantization.json)"
                                  if imported is not None and imported.edges is not None else ""))
    return 0


def write_report(path: str, text: str) -> None:
    try:
        replace_file(Path(path), text.encode())
    except OSError as e:
        raise FormatError(f"cannot write the report: {e.strerror or e}", where=path) from None


def convert_triton(args) -> int:
    """CVM -> ONNX as ``convert`` does (to -o, else straight into the repository), then the Triton repository."""
    from cvm_onnx.runtime.triton import model_folder, write_repository

    if api.is_onnx(args.source):
        complain(f"cvm-onnx convert: --triton-repo takes a CVM model (directory, or symbol file with --params); "
                 f"{args.source} is an ONNX file")
        return USAGE_ERROR
    source = Path(args.source).resolve()
    name = (source if source.is_dir() else source.parent).name
    folder = model_folder(args.triton_repo, name)
    fresh = not folder.exists()
    try:
        if args.output is None:
            args.output = str(folder / "1" / "model.onnx")
            try:
                (folder / "1").mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise FormatError(f"cannot write the Triton repository: {e.strerror or e}",
                                  where=str(folder)) from None
        args.triton_repo, repo = None, args.triton_repo
        cmd_convert(args)
        write_repository(api.load_onnx(args.output), repo, name, args.triton_server_repo)
    except BaseException:
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    from cvm_onnx.native import LIBRARY

    say(f"wrote the Triton model {folder}: config.pbtxt, 1/model.onnx" +
        (f", {LIBRARY}" if (folder / LIBRARY).exists() else ""))
    return 0


def convert_checked(args) -> int:
    """CVM -> ONNX through every checked stage; the report (if asked) and a summary, also when a stage fails. The
    CUDA form is checked and compared on the CUDA provider where onnxruntime offers it, else on the CPU one."""
    import onnxruntime

    from .pipeline import Conversion, run
    from .progress import Bar
    from .report import Report

    on_gpu = args.provider == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    conversion = Conversion(args.source, args.output, params=args.params, inline=args.inline, batch=args.batch,
                            optimize=args.optimize, float_io=args.float_io, check=True, seeds=3 if args.verify else None,
                            target=args.provider, provider="cuda" if on_gpu else "cpu")
    with Bar() as bar:
        report = Report(run(conversion, timed=True, progress=bar))
    _warn(report.warnings)
    if args.report:
        write_report(args.report, report.markdown())
    for text in report.summary() + ([f"  report: {args.report}"] if args.report else []):
        say(text)
    if report.error is not None:
        raise report.error
    return 0


def cmd_verify(args) -> int:
    from cvm_onnx.runtime.verify import exported_graph, verify

    from .progress import Bar

    onnx_model = None
    if api.is_onnx(args.model):
        onnx_model = api.load_onnx(args.model, external_data=True)
        graph = exported_graph(onnx_model, args.model)
        props = {p.key: p.value for p in onnx_model.metadata_props}
        edges = (parse_edges(props[FLOAT_IO], f"metadata {FLOAT_IO}", len(onnx_model.graph.output))
                 if FLOAT_IO in props else None)
    else:
        model = api.load(args.model, args.params)
        _warn(model.warnings)
        graph, edges = model.graph, model.edges if args.float_io else None
    data = np.array(read_npy(args.input)) if args.input else None
    with Bar() as bar:
        verdict = verify(graph, data, seeds=args.seeds, provider=args.provider, onnx_model=onnx_model, progress=bar,
                         edges=edges)
    for text in verdict.lines():
        say(text)
    return 0 if verdict.exact else RuntimeFailure.exit_code


def folds(given: list[str] | None) -> dict[str, float | None] | None:
    """``--fold NAME[=VALUE] ...`` as {name: value or None (zeros)}."""
    out = {}
    for item in given or []:
        name, eq, value = item.partition("=")
        try:
            out[name] = float(value) if eq else None
        except ValueError:
            raise UnsupportedError(f"--fold {item}: the value must be a number") from None
    return out or None


def cmd_quantize(args) -> int:
    from .progress import Bar
    from .quantize import quantize

    with Bar() as bar:
        done = quantize(args.model, args.calibration, args.output, per_channel=args.per_channel,
                        symmetric=args.symmetric, method=args.method, activation=args.activation, form=args.form,
                        save_onnx=args.save_onnx, progress=bar, outputs=args.outputs, two_part=args.two_part,
                        fold=folds(args.fold))
    g = done.imported.graph
    say(f"wrote {args.output}: {sum(not n.is_variable for n in g.nodes)} CVM op nodes, "
        f"{len(done.imported.requants)} requantizations (worst error "
        f"{max((p.error for r in done.imported.requants for p in r.plans), default=0.5):.3f} steps)")
    say(f"against the float model on the {done.samples} calibration samples:")
    for a in done.agreements:
        say(f"  {a.line()}")
    return 0


def cmd_view(args) -> int:
    from .view import view

    view(args.model, port=args.port, browse=not args.no_browser, params=args.params, ready=say)
    return 0


def cmd_run(args) -> int:
    from contextlib import nullcontext

    from .progress import Bar, native_stderr_held

    if args.model is None or (args.ray and Path(args.ray).exists()):
        if args.model is not None or not args.ray:
            args.usage.print_usage(sys.stderr)
            complain(f"cvm-onnx run: error: argument --ray: ADDRESS {args.ray} is a file or directory, not a Ray "
                     "address (auto, HOST:PORT, ray://HOST:10001)" if args.model else
                     "cvm-onnx run: error: the following arguments are required: model")
            return USAGE_ERROR
        args.model, args.ray = args.ray, ""  # `run --ray MODEL ...`: --ray took the model for its ADDRESS
    edges = None
    if api.is_onnx(args.model):
        model = api.load_onnx(args.model, external_data=True)
    else:
        loaded = api.load(args.model, args.params)
        _warn(loaded.warnings)
        model, edges = loaded.graph, loaded.edges
    with native_stderr_held() if args.ray is not None else nullcontext(), Bar() as bar:
        if args.ray is None:
            from cvm_onnx.runtime.bulk import run_many

            out = run_many(model, args.input, args.output, chunk=args.chunk, provider=args.provider, progress=bar,
                           edges=edges, workers=args.workers, cuda_graph=args.cuda_graph)
        else:
            from cvm_onnx.runtime.on_ray import run_on_ray

            out = run_on_ray(model, args.input, args.output, address=args.ray or None, actors=args.actors,
                             chunk=args.chunk, provider=args.provider, progress=bar, edges=edges,
                             cuda_graph=args.cuda_graph)
    say(f"wrote {args.output}: " + ", ".join(f"{n} {s}" for n, s in zip(out.keys, out.shapes)))
    return 0


def version() -> str:
    """``cvm-onnx --version``: this package's version, the libraries it runs on and the native library's state."""
    import onnx
    import onnxruntime

    from cvm_onnx.core.constants import __version__
    from cvm_onnx.native import status
    from cvm_onnx.runtime.sessions import cuda_status

    return "\n".join([f"cvm-onnx {__version__}", f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, "
                      f"numpy {np.__version__}, Python {sys.version.split()[0]}", status(), cuda_status()])


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show the version, the libraries' and whether the "
                         "native custom-op library is built (with CUDA kernels or not), whether CUDA is usable "
                         "here, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version())
        parser.exit()


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return n


class _Parser(argparse.ArgumentParser):
    """argparse exiting with ``USAGE_ERROR`` on a usage error."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cvm-onnx", description="CVM models to ONNX and back, bit-exact. Exit codes: docs/cli.md.")
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the traceback of any error")
    p.add_argument("--debug", action="store_true", help="print the traceback of any error")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True)

    def model_cmd(name, fn, help, aliases=(), onnx_file="an .onnx file", model_nargs=None):
        c = sub.add_parser(name, help=help, aliases=list(aliases), parents=[debug])
        c.add_argument("model", nargs=model_nargs, help=f"CVM model directory (symbol + params), a symbol file "
                       f"with --params, or {onnx_file}")
        c.add_argument("--params", help="params file when MODEL is a symbol file")
        c.set_defaults(fn=fn)
        return c

    model_cmd("validate", cmd_validate, "check a CVM model against the runtime's load-time rules (an .onnx file: "
              "import it and check the result)", ["check"])
    model_cmd("info", cmd_info, "ops, params, inputs and outputs of a CVM model; of an .onnx file its opsets, "
              "inputs and outputs, provenance and the native library it needs")
    r = model_cmd("run", cmd_run, "run a CVM model (reference executor) or an ONNX model (onnxruntime)",
                  model_nargs="?")  # `run --ray MODEL`: --ray takes MODEL for its ADDRESS; cmd_run sorts it out
    r.set_defaults(usage=r)
    r.add_argument("--input", required=True, help=".npy holding one input (int8 or int32) of the model's shape, "
                   "or N of them stacked on a new axis 0 or along the model's first axis (when it is 1); or a "
                   "directory of such .npy files (file-name order); floats for a "
                   "model imported from a quantized ONNX model (quantized as its first QuantizeLinear does)")
    r.add_argument("--output", required=True, help=".npz to write, one array per output (stacked over the "
                   "samples for N inputs); or .npy for a one-output model; float32 dequantized outputs for float input")
    r.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="onnxruntime provider (ONNX models)")
    r.add_argument("--cuda-graph", action="store_true", help="with --provider cuda: onnxruntime captures the "
                   "model's kernels into a CUDA graph once and replays it (the CUDA serving form, convert "
                   "--provider cuda: every node on the GPU, static shapes); the data is IO-bound either way")
    r.add_argument("--chunk", type=positive, default=CHUNK, metavar="N", help=f"samples per unit of work, and per "
                   f"model call where the model takes a batch (default {CHUNK})")
    r.add_argument("--workers", type=positive, metavar="W", help="chunks run at once on this machine, one "
                   "onnxruntime thread each (ONNX models; default: one per CPU on the CPU provider)")
    r.add_argument("--ray", nargs="?", const="", metavar="ADDRESS", help="run on Ray actors: a new local "
                   "instance, or the cluster at ADDRESS (auto, HOST:PORT, ray://HOST:10001); extra ray. --ray "
                   "followed by MODEL runs MODEL on a new local instance; an ADDRESS goes after MODEL or as "
                   "--ray=ADDRESS")
    r.add_argument("--actors", type=positive, metavar="K", help="Ray actors, one CPU each (default: one per CPU)")
    c = sub.add_parser("convert", help="convert a CVM model to ONNX, or an ONNX model to CVM", parents=[debug])
    c.add_argument("source", help="CVM model directory (or a symbol file with --params), or an .onnx file")
    c.add_argument("-o", "--output",
                   help="the .onnx file to write, or for an .onnx source the CVM model directory")
    c.add_argument("--params", help="params file when SOURCE is a symbol file")
    c.add_argument("--inline", action="store_true", help="write the flat form, every function inlined")
    c.add_argument("--batch", type=positive, metavar="N", help="export with batch size N: the input's first dimension "
                   "1 becomes N (refused where an op does not keep the batch axis)")
    c.add_argument("--optimize", action="store_true", help="write the serving form for the CPU provider: "
                   "requantization runs fused, no int32 round trips between float bodies (faster to run; not "
                   "importable back)")
    c.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="the serving form's target: cuda "
                   "writes the CUDA serving form (implies --optimize: every node a CUDA kernel of onnxruntime or "
                   "of the native library; --verify compares on the CUDA provider where onnxruntime has it, else on "
                   "the CPU provider, the same integer arithmetic)")
    c.add_argument("--float-io", action="store_true", help="a quantized CVM model (with quantization.json): "
                   "float32 input and outputs, quantized and dequantized in the graph (QuantizeLinear, "
                   "DequantizeLinear) around the exact integer model, as cvm-onnx run computes them")
    c.add_argument("--input-precision", type=int, default=8, metavar="N",
                   help="bits of the ONNX model's input values, |x| <= 2^(N-1)-1 (default 8; the runtime clamps "
                        "its input to them)")
    c.add_argument("--triton-repo", metavar="REPO", help="also write a Triton model repository: "
                   "REPO/<model directory's name>/1/model.onnx, config.pbtxt and the native op library if used")
    c.add_argument("--triton-server-repo", metavar="DIR", default="/models", help="where the Triton server sees "
                   "REPO, for the op library's path in config.pbtxt (default /models)")
    c.set_defaults(fn=cmd_convert, usage=c)
    c.add_argument("--report", metavar="FILE", help="write a Markdown report: stages, op table, sizes, timings "
                   "(CVM -> ONNX); for an ONNX import, which ONNX node became which CVM ops and every "
                   "requantization")
    c.add_argument("--outputs", nargs="+", metavar="NAME", help="ONNX -> CVM: cut the graph at these tensors, "
                   "which become the outputs (keep the integer part of a model that ends in float ops)")
    c.add_argument("--two-part", action="store_true", help="ONNX -> CVM: a requantization whose 32-bit product errs "
                   "by more than 2^-10 step takes two products (closer to the quantized model's arithmetic; a "
                   "slower serving form)")
    c.add_argument("--verify", action="store_true", help="also compare with the reference executor, exactly, on "
                   "0, the extremes and 3 random inputs before writing (CVM -> ONNX)")
    v = model_cmd("verify", cmd_verify, "convert a CVM model (or take an .onnx file convert wrote) and check "
                  "onnxruntime against the reference executor, element for element; name the first differing node",
                  onnx_file="an .onnx file convert wrote (not the --optimize form)")
    v.add_argument("--input", help=".npy input data (default: 0, +-(2^(p-1)-1) and random inputs)")
    v.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="onnxruntime provider")
    v.add_argument("--seeds", type=int, default=3, metavar="N", help="random inputs without --input (default 3)")
    v.add_argument("--float-io", action="store_true", help="check the export with float input and outputs (convert "
                   "--float-io) against cvm-onnx run, on float inputs: 0, +-3.4e38, +-inf, rounding ties, random")
    w = model_cmd("view", cmd_view, "show a model (.onnx, or a CVM model converted on the fly) in Netron on "
                  "127.0.0.1")
    w.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    w.add_argument("--no-browser", action="store_true", help="do not open a browser; just serve")
    q = sub.add_parser("quantize", help="quantize a float ONNX model with onnxruntime.quantization (static, "
                       "calibrated) and import it as a CVM model", parents=[debug])
    q.add_argument("model", help="the float .onnx model as shipped (one input; dynamic dims are fixed to one "
                   "calibration sample, batch 1)")
    q.add_argument("--calibration", required=True, metavar="C.npy", help="calibration samples: N inputs stacked on "
                   "axis 0, floats")
    q.add_argument("-o", "--output", required=True, metavar="DIR", help="the CVM model directory to write (with "
                   "quantization.json)")
    q.add_argument("--per-channel", action="store_true", help="weights quantized per output channel")
    q.add_argument("--symmetric", action="store_true", help="symmetric activations (zero point 0, or 128 for uint8)")
    q.add_argument("--method", choices=["minmax", "entropy", "percentile"], default="minmax",
                   help="onnxruntime's calibration method (default minmax)")
    q.add_argument("--activation", choices=["uint8", "int8"], default="uint8", help="activation type (default uint8)")
    q.add_argument("--form", choices=["qdq", "qoperator"], default="qdq", help="the quantized ONNX form made and "
                   "imported (default qdq)")
    q.add_argument("--save-onnx", metavar="Q.onnx", help="also keep the quantized ONNX model")
    q.add_argument("--outputs", nargs="+", metavar="NAME", help="cut the float model at these tensors first, which "
                   "become the outputs (keep the part before float ops CVM lacks, e.g. a final Softmax)")
    q.add_argument("--two-part", action="store_true", help="a requantization whose 32-bit product errs by more than "
                   "2^-10 step takes two products (closer to the quantized model's arithmetic; a slower serving form)")
    q.add_argument("--fold", nargs="+", metavar="NAME[=VALUE]", help="make these graph inputs constants first "
                   "(a recurrent model's states: zeros by default; a sample rate: its value), and fold the Ifs they "
                   "decide")
    q.set_defaults(fn=cmd_quantize)
    return p


def _show_warning(seen: set[str]):
    """A ``warnings.showwarning`` printing each message once as one ``warning:`` line."""
    def show(message, category, filename, lineno, file=None, line=None):
        if str(message) not in seen:
            seen.add(str(message))
            complain(f"warning: {message}")
    return show


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status is 0, the error family's code, or one of the codes above."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error
        return e.code
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning(set())
            code = args.fn(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except CVMError as e:
        if args.debug:
            traceback.print_exc()
        for problem in e.problems:
            complain(f"{e.kind}: {problem}")
        return e.exit_code
    except KeyboardInterrupt:
        complain("interrupted")
        return INTERRUPTED
    except BrokenPipeError:  # whoever read our output stopped (`cvm-onnx info m | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail again
        return BROKEN_PIPE
    except Exception as e:  # a bug of ours: say so briefly unless debugging
        if args.debug:
            traceback.print_exc()
        complain(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)")
        return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
