"""The ``cvm-onnx`` command: a thin shell over the library (see docs/cli.md for commands and exit codes)."""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import traceback
import warnings
from pathlib import Path

from cvm_onnx.core.constants import CHUNK
from cvm_onnx.core.errors import CVMError, FormatError, RuntimeFailure, UnsupportedError
from cvm_onnx.core.errors import one_line as line

# Each command imports what it needs when it runs (numpy, onnx, onnxruntime, Ray, the converters), so that
# `--help`, a usage error and `info` start at once.

# Exit codes besides the error families' (errors.py): sysexits' EX_USAGE (argparse's own 2 is taken by format
# errors) and EX_SOFTWARE, then the shell's 128 + signal number.
USAGE_ERROR = 64
INTERNAL_ERROR = 70
INTERRUPTED = 130
BROKEN_PIPE = 141
#: Where a Triton server sees the model repository by default (convert --triton-server-repo).
TRITON_SERVER_REPO = "/models"


def say(text: object) -> None:
    print(line(text))


def complain(text: object) -> None:
    print(line(text), file=sys.stderr)


def _warn(problems) -> None:
    for p in problems:
        complain(f"warning: {p}")


def cmd_validate(args) -> int:
    from . import api

    if api.is_onnx(args.model):
        model = api.validate(api.import_onnx(args.model))
        what = "imports as a CVM model"
    else:
        model = api.load(args.model, args.params)
        what = ""
    from cvm_onnx.core.validate import c_api_warnings

    _warn([*model.warnings, *c_api_warnings(model.graph)])
    g = model.graph
    say(f"ok: {args.model}: {what + ' of ' if what else ''}{sum(not n.is_variable for n in g.nodes)} op nodes, "
        f"{len(g.params)} params, valid for the CVM runtime")
    say(model.gas.line())
    return 0


def cmd_info(args) -> int:
    from . import api

    if api.is_onnx(args.model):
        from .onnx_info import describe

        for text in [f"model: {args.model}", *describe(api.load_onnx(args.model))]:
            say(text)
        return 0
    from cvm_onnx.core.ops import REGISTRY

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
    say(model.gas.line())
    say("ops:")
    for op, n in g.op_counts().items():
        say(f"  {op:<22}{n:>6}")
    if model.edges is not None:
        from .onnx_info import edge_lines

        for text in edge_lines(model.edges, "quantization.json", "its export on onnxruntime alone takes and gives "
                               "the integers"):
            say(text)
    if native_ops := sorted(op for op in g.op_counts() if REGISTRY[op].native_attrs is not None):
        from cvm_onnx.native import status

        say(f"native ops: {', '.join(native_ops)}: on onnxruntime they run in the custom-op library; {status()}")
    from cvm_onnx.core.validate import c_api_warnings

    _warn([*model.warnings, *c_api_warnings(model.graph)])
    return 0


def cmd_convert(args) -> int:
    from . import api

    if args.triton_repo is not None:
        return convert_triton(args)
    if (args.report or args.verify) and not api.is_onnx(args.source):
        return convert_checked(args)
    measured = samples_for_report(args) if args.samples is not None else None  # checked before anything is written
    from .progress import Bar

    importing = api.is_onnx(args.source)
    with Bar() if importing else contextlib.nullcontext() as bar:  # an import names its stage and counts its nodes
        done = api.convert(args.source, args.output, params=args.params, inline=args.inline,
                           input_precision=8 if args.input_precision is None else args.input_precision,
                           batch=args.batch, optimize=args.optimize, outputs=args.outputs, provider=args.provider, target=args.target,
                           float_io=args.float_io, two_part=not args.one_part, progress=bar)
    imported = done if importing else None
    from cvm_onnx.core.gas import measure

    gas = done.gas if imported is None else measure(imported.graph.nodes)
    layers = None
    if imported is not None and args.report:
        from .report import import_markdown

        one_part = api.one_part_gas(api.load_onnx(args.source), Path(args.source).parent) \
            if api.has_two_parts(imported) else None
        if measured is not None:
            from .layers import markdown

            layers = measured_layers(imported, *measured)
        write_report(args.report, import_markdown(args.source, args.output, imported, gas, one_part,
                                                  None if layers is None else markdown(layers)))
    packed = imported is not None and imported.edges is not None and imported.edges.inputs
    say(f"wrote {args.output}" + (" (several inputs packed into data: their layout in quantization.json)" if packed
                                  else " (quantized: float edges in quantization.json)"
                                  if imported is not None and imported.edges is not None else ""))
    say(("the CVM model's " if imported is None else "") + gas.line())
    if imported is not None:
        from cvm_onnx.core.validate import c_api_warnings

        _warn([*imported.notes, *c_api_warnings(imported.graph)])
    if layers is not None:
        show_layers(layers, f"per quantized tensor, on the {layers.samples} samples of {args.samples}:")
    return 0


def samples_for_report(args):
    """``convert --report R --samples S [--float-model F]``: the quantized model, its samples (checked as
    quantize's calibration samples) and the float model (checked to run on the first sample)."""
    from .api import load_onnx
    from .layers import check_float_model
    from .quantize import quiet_onnxruntime, samples_of

    model = load_onnx(args.source, external_data=True)
    _, _, samples = samples_of(model, args.samples)
    float_model = None
    if args.float_model:
        float_model = load_onnx(args.float_model, external_data=True)
        with quiet_onnxruntime():
            check_float_model(float_model, model.graph.input[0].name, samples[0], args.float_model)
    return model, samples, float_model


def measured_layers(imported, model, samples, float_model):
    """Each quantized tensor's distance on the samples (``layers.layer_report``)."""
    from .layers import layer_report
    from .progress import Bar
    from .quantize import quiet_onnxruntime

    with Bar() as bar, quiet_onnxruntime():
        return layer_report(model, imported, samples, float_model, bar)


def show_layers(report, title: str) -> None:
    """The per-tensor report as a table on stdout (rich; names from the model printed escaped, never as markup),
    and why the exact arithmetic is missing, if it is, as a warning."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    from .layers import COLUMNS, cells

    say(title)
    table = Table(*COLUMNS, box=None, pad_edge=False)
    for c in table.columns[2:]:
        c.justify = "right"
    for r in report.layers:
        table.add_row(*(Text(line(c)) for c in cells(r)))
    console = Console(file=sys.stdout, highlight=False)
    console.width = max(console.width, Measurement.get(console, console.options.update_width(1 << 16), table).maximum)
    console.print(table)
    if report.note:
        _warn([f"per-layer report: {report.note}"])


def write_report(path: str, text: str) -> None:
    from cvm_onnx.core.format.model_dir import replace_file

    try:
        replace_file(Path(path), text.encode())
    except OSError as e:
        raise FormatError(f"cannot write the report: {e.strerror or e}", where=path) from None


def convert_triton(args) -> int:
    """CVM -> ONNX as ``convert`` does (to -o, else straight into the repository), then the Triton repository."""
    from cvm_onnx.runtime.triton import model_folder, write_repository

    from . import api

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
        write_repository(api.load_onnx(args.output), repo, name, args.triton_server_repo or TRITON_SERVER_REPO)
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

    on_gpu = (args.target or args.provider) == "cuda" and \
        "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    conversion = Conversion(args.source, args.output, params=args.params, inline=args.inline, batch=args.batch,
                            optimize=args.optimize or args.target is not None, float_io=args.float_io, check=True,
                            seeds=3 if args.verify else None,
                            target=args.target or args.provider, provider="cuda" if on_gpu else "cpu")
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
    from cvm_onnx.core.constants import FLOAT_IO, QUANTIZATION
    from cvm_onnx.core.format.edges import parse_edges
    from cvm_onnx.runtime.verify import exported_graph, given_cases, verify

    from . import api
    from .progress import Bar

    onnx_model = None
    if api.is_onnx(args.model):
        onnx_model = api.load_onnx(args.model, external_data=True)
        graph = exported_graph(onnx_model, args.model)
        props = {p.key: p.value for p in onnx_model.metadata_props}
        edges = (parse_edges(props[FLOAT_IO], f"metadata {FLOAT_IO}", len(onnx_model.graph.output))
                 if FLOAT_IO in props else None)
        quantized = QUANTIZATION in props
        if args.float_io and edges is None:
            raise UnsupportedError("--float-io: this .onnx file takes and gives integers (convert --float-io writes "
                                   "the export with float input and outputs)", where=args.model)
    else:
        model = api.load(args.model, args.params)
        _warn(model.warnings)
        graph, edges, quantized = model.graph, model.edges if args.float_io else None, model.edges is not None
        if args.float_io and edges is None:
            raise UnsupportedError("--float-io: float input and outputs need a quantized model (a model directory "
                                   "with quantization.json, as convert and quantize write for a quantized ONNX "
                                   "model)", where=args.model)
    source, packing = args.input, _onnx_edges(onnx_model) if onnx_model is not None else model.edges
    if onnx_model is not None and packing is not None:  # the metadata against the CVM graph the export holds
        packing.fit(graph, f"{args.model}: metadata {QUANTIZATION}")
    if source is not None and packing is not None and packing.inputs:  # named inputs of a packed model
        from cvm_onnx.core.format.npy import read_npz

        source = packing.pack(read_npz(source, "the inputs (one array per input name)"))
    cases = None if source is None else given_cases(graph, source, edges, quantized and edges is None)
    with Bar() as bar:
        verdict = verify(graph, seeds=3 if args.seeds is None else args.seeds, provider=args.provider,
                         onnx_model=onnx_model, progress=bar, edges=edges, cases=cases)
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
            raise UnsupportedError("the value must be a number", where=f"--fold {item}") from None
    return out or None


def cmd_quantize(args) -> int:
    from .progress import Bar
    from .quantize import quantize

    with Bar() as bar:
        done = quantize(args.model, args.calibration, args.output, per_channel=args.per_channel,
                        symmetric=args.symmetric, method=args.method, activation=args.activation, form=args.form,
                        save_onnx=args.save_onnx, progress=bar, outputs=args.outputs, two_part=not args.one_part,
                        fold=folds(args.fold), report=args.report is not None, models=False)
    g = done.imported.graph
    plans = [p for r in done.imported.requants for p in [*r.plans, *(f.plan for _, f in r.far)]]
    say(f"wrote {args.output}: {sum(not n.is_variable for n in g.nodes)} CVM op nodes, "
        f"{len(done.imported.requants)} requantizations (worst error "
        f"{max((p.error for p in plans), default=0.5):.3f} steps)")
    from cvm_onnx.core.gas import measure

    from .report import gas_lines

    for text in gas_lines(done.imported, measure(g.nodes), done.one_part_gas):
        say(text)
    say(f"against the float model on the {done.samples} calibration samples:")
    for a in done.agreements:
        say(f"  {a.line()}")
    if done.layers is not None:
        from .layers import markdown, to_json

        text = to_json(done.layers) if args.report.endswith(".json") else \
            "\n".join([f"# Per-layer report: {args.model} -> {args.output}", "", *markdown(done.layers)]) + "\n"
        write_report(args.report, text)
        show_layers(done.layers, f"per quantized tensor, on the {done.samples} calibration samples (report: "
                    f"{args.report}):")
    return 0


def cmd_view(args) -> int:
    from .view import view

    view(args.model, port=args.port, browse=not args.no_browser, params=args.params, ready=say)
    return 0


def cmd_run(args) -> int:
    from contextlib import nullcontext

    from . import api
    from .progress import Bar, native_stderr_held

    edges = None
    if api.is_onnx(args.model):
        model = api.load_onnx(args.model, external_data=True)
    else:
        loaded = api.load(args.model, args.params)
        _warn(loaded.warnings)
        model, edges = loaded.graph, loaded.edges
    inputs, packing = args.input, edges if edges is not None else _onnx_edges(model)
    if packing is not None and packing.inputs:  # one array per input of a model of several packed into data
        from cvm_onnx.core.constants import CONVERTED_FROM, OPTIMIZED, QUANTIZATION
        from cvm_onnx.core.format.npy import read_npz

        props = {p.key: p.value for p in getattr(model, "metadata_props", ())}
        if edges is None and props.get(CONVERTED_FROM) == "CVM" and OPTIMIZED not in props:
            from cvm_onnx.runtime.verify import exported_graph

            packing.fit(exported_graph(model, args.model), f"{args.model}: metadata {QUANTIZATION}")

        inputs = packing.pack(read_npz(args.input, "the inputs (one array per input name)"))
    with native_stderr_held() if args.ray is not None else nullcontext(), Bar() as bar:
        if args.ray is None:
            from cvm_onnx.runtime.bulk import run_many

            out = run_many(model, inputs, args.output, chunk=args.chunk, provider=args.provider, progress=bar,
                           edges=edges, workers=args.workers, cuda_graph=args.cuda_graph)
        else:
            from cvm_onnx.runtime.on_ray import run_on_ray

            out = run_on_ray(model, inputs, args.output, address=args.ray or None, actors=args.actors,
                             chunk=args.chunk, provider=args.provider, progress=bar, edges=edges,
                             cuda_graph=args.cuda_graph,
                             here_if_faster=lambda why: complain(f"note: --ray: {why}: runs here without Ray"))
    say(f"wrote {args.output}: " + ", ".join(f"{n} {s}" for n, s in zip(out.keys, out.shapes)))
    return 0


def _onnx_edges(model):
    """The edges an ONNX export keeps in its metadata (``cvm.quantization``), if any (None for a CVM graph)."""
    from cvm_onnx.core.constants import QUANTIZATION
    from cvm_onnx.core.format.edges import parse_edges

    from cvm_onnx.core.format.onnx_file import dims

    props = {p.key: p.value for p in getattr(model, "metadata_props", ())}
    if QUANTIZATION not in props:
        return None
    edges = parse_edges(props[QUANTIZATION], f"metadata {QUANTIZATION}", len(model.graph.output))
    inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    edges.fit_declared(dims(inputs[0]) if len(inputs) == 1 else None, [dims(o) for o in model.graph.output],
                       f"metadata {QUANTIZATION}")
    return edges


def version() -> str:
    """``cvm-onnx --version``: this package's version, the libraries it runs on and the native library's state."""
    import numpy as np
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


#: The most random inputs ``verify --seeds`` draws (each is held until the comparison ends).
MAX_SEEDS = 1 << 16


def seeds(text: str) -> int:
    """An argparse type: an integer in [0, MAX_SEEDS]."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {MAX_SEEDS}, not {text!r}")
    return n


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [0, 65535] (0: a free one), not {text!r}")
    return n


def _onnx(path: str | None) -> bool:
    from .api import is_onnx

    return path is not None and is_onnx(path)


_CVM_SOURCE = "applies to a CVM model (CVM -> ONNX); SOURCE is an .onnx file"
_ONNX_SOURCE = "applies to an .onnx SOURCE (ONNX -> CVM); SOURCE is a CVM model"
_SYMBOL_FILE = "applies to a CVM model (a symbol file's params); MODEL is an .onnx file"

#: Per command, the options that apply only in some uses: (option, whether it applies, why not). An option given
#: a value other than its default where it does not apply is a usage error, never ignored.
SCOPES = {
    "run": [
        ("--params", lambda a: not _onnx(a.model), _SYMBOL_FILE),
        ("--provider", lambda a: _onnx(a.model) or a.ray is not None, "chooses onnxruntime's provider for an .onnx "
         "model (or, with --ray, the serving form the actors run); a CVM model runs here on the reference executor "
         "(for CUDA convert it first: convert MODEL -o m.onnx --provider cuda)"),
        ("--cuda-graph", lambda a: a.provider == "cuda", "applies with --provider cuda only"),
        ("--workers", lambda a: a.ray is None, "applies to a run on this machine; with --ray, use --actors"),
        ("--actors", lambda a: a.ray is not None, "applies with --ray only"),
    ],
    "convert": [
        ("--params", lambda a: not _onnx(a.source), "applies to a CVM model (a symbol file's params); SOURCE is an "
         ".onnx file"),
        *((option, lambda a: not _onnx(a.source), _CVM_SOURCE) for option in
          ("--inline", "--batch", "--optimize", "--provider", "--target", "--float-io", "--verify",
           "--triton-repo")),
        ("--triton-server-repo", lambda a: a.triton_repo is not None, "applies with --triton-repo only"),
        *((option, lambda a: _onnx(a.source), _ONNX_SOURCE) for option in
          ("--input-precision", "--outputs", "--one-part", "--two-part")),
        ("--samples", lambda a: _onnx(a.source) and a.report is not None, "applies to an .onnx SOURCE with "
         "--report (the per-tensor distances go into the import's report)"),
        ("--float-model", lambda a: a.samples is not None, "applies with --samples only"),
    ],
    "verify": [
        ("--params", lambda a: not _onnx(a.model), _SYMBOL_FILE),
        ("--seeds", lambda a: a.input is None, "sets the random inputs, drawn without --input only"),
    ],
    **{command: [("--params", lambda a: not _onnx(a.model), _SYMBOL_FILE)] for command in ("validate", "check",
                                                                                           "info", "view")},
}


def check_usage(args) -> None:
    """The command line's combinations that argparse cannot check: ``run --ray MODEL`` (--ray took MODEL for its
    ADDRESS), convert's output, and the options given where they do not apply (``SCOPES``, all of them named).
    Exits with ``USAGE_ERROR`` through the command's parser."""
    usage = args.usage
    if args.command == "run" and (args.model is None or (args.ray and Path(args.ray).exists())):
        if args.model is not None:
            usage.error(f"argument --ray: ADDRESS {args.ray} is a file or directory, not a Ray address (auto, "
                        "HOST:PORT, ray://HOST:10001)")
        if not args.ray:
            usage.error("the following arguments are required: model")
        args.model, args.ray = args.ray, ""
    if args.command == "convert" and args.output is None and args.triton_repo is None:
        usage.error("the following arguments are required: -o/--output (or --triton-repo)")
    misplaced = [f"{option} {why}" for option, applies, why in SCOPES.get(args.command, ())
                 if getattr(args, option[2:].replace("-", "_")) != usage.get_default(option[2:].replace("-", "_"))
                 and not applies(args)]
    if misplaced:
        usage.error("; ".join(misplaced))


class _Parser(argparse.ArgumentParser):
    """argparse exiting with ``USAGE_ERROR`` on a usage error."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def parts(command: argparse.ArgumentParser, prefix: str) -> None:
    """A quantized import's products: ``--one-part``, or ``--two-part`` (the default, also accepted by name)."""
    group = command.add_mutually_exclusive_group()
    group.add_argument("--one-part", action="store_true", help=prefix + "each requantization in one 32-bit product "
                       "(fewer CVM ops and gas; by default a requantization takes two or three products where they "
                       "come closer to the quantized model's arithmetic, docs/import.md)")
    group.add_argument("--two-part", action="store_true", help=prefix + "products in two or three parts where "
                       "closer (the default; also accepted by name)")


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
        c.set_defaults(fn=fn, usage=c)
        return c

    model_cmd("validate", cmd_validate, "check a CVM model against the runtime's load-time rules (an .onnx file: "
              "import it and check the result)", ["check"])
    model_cmd("info", cmd_info, "ops, params, inputs and outputs of a CVM model; of an .onnx file its opsets, "
              "inputs and outputs, provenance and the native library it needs")
    r = model_cmd("run", cmd_run, "run a CVM model (reference executor) or an ONNX model (onnxruntime)",
                  model_nargs="?")  # `run --ray MODEL`: --ray takes MODEL for its ADDRESS; check_usage sorts it out
    r.add_argument("--input", required=True, help=".npy holding one input of the model's shape, of any integer "
                   "type (int8 and int32 clamped to the input precision as the runtime does; others, such as uint8 "
                   "images, must fit it), or N of them stacked on a new axis 0 or along the model's first axis "
                   "(when it is 1); or a directory of such .npy files (file-name order); floats for a model "
                   "imported from a quantized ONNX model (quantized as its first QuantizeLinear does) and for an "
                   "export with float input (convert --float-io), which takes floats only; for a model of several "
                   "inputs packed into data, an .npz of one array per input name (one sample of each, or N "
                   "stacked), packed as its quantization.json (or the export's metadata) lays them out")
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
    r.add_argument("--ray", nargs="?", const="", metavar="ADDRESS", help="run on Ray actors: the cluster at "
                   "ADDRESS (auto, HOST:PORT, ray://HOST:10001; local: a new local instance), or without ADDRESS "
                   "the one RAY_ADDRESS names or `ray start` started here, else on this machine without Ray (a new "
                   "local instance cannot be faster); extra ray. An ADDRESS goes after MODEL or as --ray=ADDRESS")
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
    c.add_argument("--target", choices=["cpu", "cuda", "native"], help="the serving form's target: cpu (as "
                   "--optimize), cuda (as --provider cuda), native (this machine's best: the layout and operand types "
                   "of its integer products fixed at export, so plain onnxruntime runs it as fast as cvm-onnx run)")
    c.add_argument("--float-io", action="store_true", help="a quantized CVM model (with quantization.json): "
                   "float32 input and outputs, quantized and dequantized in the graph (QuantizeLinear, "
                   "DequantizeLinear) around the exact integer model, as cvm-onnx run computes them")
    c.add_argument("--input-precision", type=int, metavar="N",
                   help="bits of the ONNX model's input values, |x| <= 2^(N-1)-1 (default 8; the runtime clamps "
                        "its input to them)")
    c.add_argument("--triton-repo", metavar="REPO", help="also write a Triton model repository: "
                   "REPO/<model directory's name>/1/model.onnx, config.pbtxt and the native op library if used")
    c.add_argument("--triton-server-repo", metavar="DIR", help="where the Triton server sees "
                   "REPO, for the op library's path in config.pbtxt (default /models)")
    c.set_defaults(fn=cmd_convert, usage=c)
    c.add_argument("--report", metavar="FILE", help="write a Markdown report: stages, op table, sizes, timings "
                   "(CVM -> ONNX); for an ONNX import, which ONNX node became which CVM ops and every "
                   "requantization")
    c.add_argument("--samples", metavar="S.npy", help="ONNX -> CVM, with --report, a quantized model: N inputs "
                   "stacked on axis 0 (floats, as quantize's --calibration); the report and stdout then give each "
                   "quantized tensor's distance on them from the exact arithmetic, in its own steps")
    c.add_argument("--float-model", metavar="F.onnx", help="with --samples: the float model the quantized one was "
                   "made from; its tensors of the same names give each quantized tensor's distance from it too")
    c.add_argument("--outputs", nargs="+", metavar="NAME", help="ONNX -> CVM: cut the graph at these tensors, "
                   "which become the outputs (keep the integer part of a model that ends in float ops)")
    parts(c, "ONNX -> CVM: ")
    c.add_argument("--verify", action="store_true", help="also compare with the reference executor, exactly, on "
                   "0, the extremes and 3 random inputs before writing (CVM -> ONNX)")
    v = model_cmd("verify", cmd_verify, "convert a CVM model (or take an .onnx file convert wrote) and check "
                  "onnxruntime against the reference executor, element for element; name the first differing node",
                  onnx_file="an .onnx file convert wrote (not the --optimize form)")
    v.add_argument("--input", help="the inputs to compare on, as run --input takes them: one .npy sample, N of them "
                   "stacked, or a directory of .npy files; each sample is compared (default: 0, +-(2^(p-1)-1) and "
                   "random inputs); floats with --float-io; for a model of several inputs packed into data, an .npz of "
                   "one array per input name, packed as run packs it")
    v.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="onnxruntime provider")
    v.add_argument("--seeds", type=seeds, metavar="N", help=f"random inputs without --input (default 3, at most "
                   f"{MAX_SEEDS})")
    v.add_argument("--float-io", action="store_true", help="check the export with float input and outputs (convert "
                   "--float-io) against cvm-onnx run, on float inputs: 0, +-3.4e38, +-inf, rounding ties, random")
    w = model_cmd("view", cmd_view, "show a model (.onnx, or a CVM model converted on the fly) in Netron on "
                  "127.0.0.1")
    w.add_argument("--port", type=port, default=0, help="port to serve on (default: a free one)")
    w.add_argument("--no-browser", action="store_true", help="do not open a browser; just serve")
    q = sub.add_parser("quantize", help="quantize a float ONNX model with onnxruntime.quantization (static, "
                       "calibrated) and import it as a CVM model", parents=[debug])
    q.add_argument("model", help="the float .onnx model as shipped (several inputs are packed into one data; "
                   "dynamic dims are fixed to one calibration sample, batch 1)")
    q.add_argument("--calibration", required=True, metavar="C.npy", help="calibration samples: N inputs stacked on "
                   "axis 0, floats; for a model of several inputs (packed into one data), an .npz of one array per "
                   "input name, N samples each")
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
    parts(q, "")
    q.add_argument("--report", metavar="FILE", help="also measure every quantized tensor on the calibration "
                   "samples, in its own steps, against the float model and the exact arithmetic: a table on stdout, "
                   "written to FILE as Markdown (JSON if FILE ends in .json)")
    q.add_argument("--fold", nargs="+", action="extend", metavar="NAME[=VALUE]", help="make these graph inputs "
                   "constants first (a recurrent model's states: zeros by default; a sample rate, an attention mask: "
                   "its value), and fold the Ifs they or the input's shape decide (repeatable); the inputs left are "
                   "packed")
    q.set_defaults(fn=cmd_quantize, usage=q)
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
        check_usage(args)
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
