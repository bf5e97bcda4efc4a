"""The one place that creates onnxruntime sessions: provider choice, the custom-op libraries, exact options.

* Provider: ``"cpu"``, or ``"cuda"`` when onnxruntime reports CUDAExecutionProvider (else ``RuntimeFailure``).
  Nodes without a CUDA kernel run on the CPU EP, with the CPU kernels' semantics.
* Custom ops: the native library (domain cvm.native) is registered on every session. When it was not built, a
  model using it is rewritten to the pure-Python fallback (``cvm_onnx.native.fallback``) with a warning;
  ``native=False`` asks for the fallback, ``native=True`` refuses to run without the library.
* Exactness: the exported graphs compute on integers (or on floats that carry integers, where a lowering proves
  every sum exact), so no option changes a result by rounding. The optimizer stays fully on: on integer graphs
  every level gives identical results, and constant folding runs the same CPU kernels as the session.
  ``use_deterministic_compute`` is set. For CUDA, ``use_tf32=0`` (TF32 would round float inputs to 10 mantissa
  bits, breaking integers carried in floats) and ``cudnn_conv_algo_search=DEFAULT`` (cuDNN's implicit GEMM,
  exact on integer sums within 2^24 in any order; ``conv_search=`` "HEURISTIC" or "EXHAUSTIVE" lets cuDNN pick
  its fastest algorithm, which may be FFT or Winograd, whose transforms round: not proven exact, so only on
  request, and measured exact or not by benchmarks/bench_cuda.py). The CUDA serving form (``to_onnx(...,
  provider="cuda")``) holds no Conv, so the choice does not touch it.
* Data on the device (``Bound``): a call binds its inputs and outputs (IO binding), each copied once to the
  session's device and back; with static shapes the buffers are allocated once per thread and reused, which is
  what ``cuda_graph=True`` (onnxruntime captures the session's kernels once and replays them) requires.
* Threads, chosen by measurement (benchmarks/RESULTS.md, "Measurements behind the code's choices"): a model
  whose inputs hold one sample gets one thread; a batched model (first dimension > 1) gets one spinning thread
  per usable CPU (the native kernels split their work over them too). ``threads=`` overrides the count;
  ``bulk.run_many`` runs several one-thread calls at once instead, which is faster still. The graph optimizer
  stays at its highest level, which was also the fastest.
* Layout of the serving form's one-group integer products: a model whose target fixed it at export
  (``cvm_onnx.serving.target``) runs as exported. One exported with layout "session" gets the target layout's
  passes here (``cvm_onnx.serving.cpu_layout``): ``layout=`` "rows" (the tensors between them kept
  channels-last), "fused" (each convolution one kernel), "columns", or "measure" (the three timed on zeros in
  their steady state, ``route_cache.measure``, each in a session whose threads stop spinning after a run so that
  it does not slow the others; the fastest kept and remembered, the choice and the timings written into the
  session's ``cvm.routes``); by default
  the layout remembered for this model on this CPU with these threads (``cvm_onnx.serving.route_cache``), else
  "measure": on every CPU, a session keeps the fastest of the three.
* Versions: the exporter writes opset ``OPSET`` and IR version ``IR_VERSION``; before the first session, a tiny
  model stamped with them must load, else ``RuntimeFailure`` says which onnxruntime is needed.
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from functools import cache

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from cvm_onnx.core.constants import IR_VERSION, OPSET, PRECISION, ROUTES, precision_of
from cvm_onnx.core.errors import CVMError, FormatError, Problem, RuntimeFailure
from cvm_onnx.core.executor import integer_input
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.core.format.onnx_safety import readable, unsafe_nodes
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN
from cvm_onnx.native import SERVING_KERNELS, cpu, cuda_ops, fallback, library_path
from cvm_onnx.runtime.placement import cuda_refusals
from cvm_onnx.serving import route_cache
from cvm_onnx.serving.cpu_layout import layout_passes
from cvm_onnx.serving.passes import Sequential
from cvm_onnx.serving.route_cache import batched_input, usable_cpus  # noqa: F401  (usable_cpus: for bulk, on_ray)
from cvm_onnx.serving.target import Target

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
CUDA_OPTIONS = {"use_tf32": "0", "cudnn_conv_algo_search": "DEFAULT"}
CONV_SEARCHES = ("DEFAULT", "HEURISTIC", "EXHAUSTIVE")

ModelLike = onnx.ModelProto | bytes | str | os.PathLike


def one_line(e: Exception) -> str:
    """onnxruntime's message on one line (it breaks some over several)."""
    return " ".join(str(e).split())


@cache
def _probe() -> bytes:
    """A one-node model (int32 Identity) of opset ``OPSET`` and IR ``IR_VERSION``, to start a session with."""
    x = helper.make_tensor_value_info("x", TensorProto.INT32, [1])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [1])
    return onnx_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])) \
        .SerializeToString()


@cache
def _onnxruntime_problem() -> str | None:
    """Why the installed onnxruntime cannot load a tiny model of opset ``OPSET`` and IR ``IR_VERSION``, else None
    (asked once per process)."""
    try:
        ort.InferenceSession(_probe(), _options(), providers=[PROVIDERS["cpu"]])
    except Exception as e:  # noqa: BLE001  (onnxruntime's refusals come in several types)
        return (f"onnxruntime {ort.__version__} cannot load models of opset {OPSET} and IR version {IR_VERSION}, "
                f"which cvm-onnx writes; install onnxruntime >= 1.31 ({one_line(e)})")
    return None


def check_onnxruntime() -> None:
    """Raise ``RuntimeFailure`` unless the installed onnxruntime loads opset ``OPSET``, IR ``IR_VERSION`` models."""
    if (problem := _onnxruntime_problem()) is not None:
        raise RuntimeFailure(problem)


def cuda_status() -> str:
    """One line: whether onnxruntime's CUDA provider starts here (a one-node session on it) and whether the
    native library has its CUDA kernels, i.e. whether the CUDA serving form can run here."""
    available = PROVIDERS["cuda"] in ort.get_available_providers()
    starts, why = False, f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)"
    if available:
        try:
            sess = ort.InferenceSession(_probe(), _options(), providers=_providers("cuda"))
            starts = PROVIDERS["cuda"] in sess.get_providers()
            why = "CUDAExecutionProvider starts" if starts else "CUDAExecutionProvider does not start (check the " \
                "CUDA and cuDNN libraries: README, CUDA)"
        except Exception as e:  # noqa: BLE001  (onnxruntime's own exception types)
            why = f"CUDAExecutionProvider does not start: {one_line(e)}"
    kernels = bool(cuda_ops(library_path()))
    usable = "usable here" if starts and kernels else "not usable here"
    return f"CUDA: {usable}: {why}; native CUDA kernels: {'built' if kernels else 'not built'}"


SPINNING = "session.intra_op.allow_spinning"


def _options(threads: int = 1, spin: bool = False) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry(SPINNING, "1" if spin else "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.use_deterministic_compute = True
    so.log_severity_level = 4  # errors are raised as exceptions; do not print them twice (3 still logs them)
    return so


def _providers(provider: str, conv_search: str = "DEFAULT", cuda_graph: bool = False) -> list:
    if provider not in PROVIDERS:
        raise RuntimeFailure(f"unknown provider {provider!r} (choose from {', '.join(PROVIDERS)})")
    if conv_search not in CONV_SEARCHES:
        raise RuntimeFailure(f"conv_search={conv_search!r}: choose from {', '.join(CONV_SEARCHES)}")
    if provider == "cpu":
        if cuda_graph:
            raise RuntimeFailure("a CUDA graph needs provider 'cuda'")
        return [PROVIDERS["cpu"]]
    available = ort.get_available_providers()
    if PROVIDERS["cuda"] not in available:
        raise RuntimeFailure(f"provider 'cuda' asked for, but onnxruntime {ort.__version__} offers only "
                             f"{', '.join(available)}; install onnxruntime-gpu (with CUDA and cuDNN) instead of "
                             f"onnxruntime")
    options = CUDA_OPTIONS | {"cudnn_conv_algo_search": conv_search} | (
        {"enable_cuda_graph": "1"} if cuda_graph else {})
    return [(PROVIDERS["cuda"], options), PROVIDERS["cpu"]]


def uses_serving_kernels(model: onnx.ModelProto) -> bool:
    """Whether the graph uses the serving form's native kernels (im2col, requantize), which have no fallback."""
    return any(n.op_type in SERVING_KERNELS and n.domain == NATIVE_DOMAIN for n in model.graph.node)


def _load(model: ModelLike) -> onnx.ModelProto:
    """The model, checked and its external data read from the model file's directory (``readable``): a model
    given as a ModelProto or bytes has none, so any external tensor of it is refused (onnxruntime would look for
    its file in the working directory); a node onnxruntime dies on is refused too (``unsafe_nodes``: a required
    input left '', an attribute out of the range onnxruntime assumes)."""
    if isinstance(model, onnx.ModelProto):
        return _checked(readable(model, None))
    try:
        if isinstance(model, bytes):
            return _checked(readable(onnx.load_from_string(model), None))
        proto = onnx.load(os.fspath(model), load_external_data=False)
    except Exception as e:  # protobuf and file errors come in several types
        raise RuntimeFailure(f"cannot read the ONNX model: {e}") from None
    return _checked(readable(proto, os.path.dirname(os.path.abspath(model))))


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    if problems := unsafe_nodes(model):
        raise FormatError(problems)
    return model


LAYOUTS = ("rows", "fused", "columns", "measure")


def _zeros(sess: ort.InferenceSession) -> dict[str, np.ndarray]:
    return {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], _NUMPY_TYPES.get(i.type, np.int32))
            for i in sess.get_inputs()}


def _timing_options(so: ort.SessionOptions) -> ort.SessionOptions:
    """The options of the candidates' sessions timed against each other: ``so``'s threads and spinning, the native
    library, and the threads' spinning stopped when a run ends, so that an idle candidate's threads do not spin on
    the CPUs another candidate is timed on (each session has its own thread pool)."""
    timing = _options(so.intra_op_num_threads, spin=so.get_session_config_entry(SPINNING) == "1")
    timing.add_session_config_entry("session.force_spinning_stop", "1")
    timing.register_custom_ops_library(library_path())
    return timing


def _choice(candidates: dict[str, onnx.ModelProto], so: ort.SessionOptions, providers: list,
            key: route_cache.RouteKey, fresh: bool) -> route_cache.Choice:
    """The layout ``route_cache.choose`` takes for ``key``: remembered, else the candidates' sessions (options
    ``_timing_options``) timed on zeros. A candidate onnxruntime refuses is left out with a ``RuntimeWarning``
    naming it; where it refuses every one, its error on the first is raised."""
    sessions: dict[str, ort.InferenceSession] = {}
    timing = _timing_options(so)

    def runs() -> dict:
        refused = {}
        for k, p in candidates.items():
            try:
                sessions[k] = ort.InferenceSession(p.SerializeToString(), timing, providers=providers)
            except Exception as e:  # noqa: BLE001  (onnxruntime's own exception types)
                refused[k] = e
        if not sessions:
            raise next(iter(refused.values()))
        for k, e in refused.items():
            warnings.warn(f"layout {k}: onnxruntime refused it ({one_line(e)}); measured without it", RuntimeWarning,
                          stacklevel=6)
        return {k: (lambda s=sess, f=_zeros(sess): s.run(None, f)) for k, sess in sessions.items()}

    return route_cache.choose(key, runs, tuple(candidates), fresh)


def _measured(candidates: dict[str, onnx.ModelProto], so: ort.SessionOptions, providers: list,
              key: route_cache.RouteKey, fresh: bool) -> tuple[ort.InferenceSession, onnx.ModelProto]:
    """The session (options ``so``) of the layout ``_choice`` takes, its model's ``cvm.routes`` recording the
    choice on every integer-products route."""
    choice = _choice(candidates, so, providers, key, fresh)
    proto = candidates[choice.layout]
    props = {p.key: p for p in proto.metadata_props}
    if ROUTES in props:
        note = f"; {choice.note()}"
        routes = [[name, route + (note if route.startswith("integer products") else ""), why]
                  for name, route, why in json.loads(props[ROUTES].value)]
        props[ROUTES].value = json.dumps(routes)
    return ort.InferenceSession(proto.SerializeToString(), so, providers=providers), proto


def layout_choice(model: ModelLike, threads: int | None = None, fresh: bool = False) -> route_cache.Choice | None:
    """The layout a CPU session of ``model`` with ``threads`` takes (``session``'s default: remembered, else
    measured and remembered; ``fresh``: measured anew), for a serving form exported with layout "session" whose
    products are rows; None for any other model."""
    check_onnxruntime()
    proto = _load(model)
    library = library_path()
    if library is None or not uses_serving_kernels(proto):
        return None
    fixed = Target.of(proto)
    if fixed is not None and fixed.layout != "session":
        return None
    candidates, operands = _serving_forms(proto, None, "measure")
    if len(candidates) < 2:
        return None
    so = _options(threads or route_cache.default_threads(proto), spin=batched_input(proto))
    so.register_custom_ops_library(library)
    key = route_cache.RouteKey.of(proto, so.intra_op_num_threads, operands)
    try:
        return _choice(candidates, so, _providers("cpu"), key, fresh)
    except (CVMError, Warning):
        raise
    except Exception as e:  # noqa: BLE001  (onnxruntime's own exception types)
        raise RuntimeFailure(f"onnxruntime refused the model: {one_line(e)}") from None


def _serving_forms(proto: onnx.ModelProto, products: str | None, layout: str | None,
                   ) -> tuple[dict[str, onnx.ModelProto], str]:
    """The serving form as the session may run it, by layout, and its operands. A model whose target fixed its
    layout at export (``Target.of``) runs as it is (``products`` and ``layout`` must be None); one exported with
    layout "session" gets here the passes of its layout (``cpu_layout.layout_passes``): ``layout``, else (None, or
    "measure") each of rows, fused and columns, for ``route_cache`` to choose from, and its operands: ``products``
    "u8u8", or "u8s8" for the widest operands this CPU computes exactly (``native.cpu``), else this machine's."""
    fixed = Target.of(proto)
    if fixed is not None and fixed.layout != "session":
        if products is not None or layout is not None:
            raise RuntimeFailure(f"this model's layout ({fixed.layout}) and operands ({fixed.operands}) were fixed at "
                                 f"export for its target; export it with layout 'session' to choose them here")
        if fixed.operands == "u8s8" and not cpu.unbounded() or fixed.operands == "u8s8-rows0" and \
                cpu.products() != "u8s8":
            raise RuntimeFailure(f"this model multiplies uint8 x int8 ({fixed.operands}), which onnxruntime does not "
                                 f"compute exactly on this CPU (here: {cpu.products()}, every product: "
                                 f"{cpu.unbounded()}); export it for this machine's target")
        return {fixed.layout: proto}, fixed.operands
    if products not in (None, "u8u8", "u8s8") or (products == "u8s8" and cpu.products() != "u8s8"):
        raise RuntimeFailure(f"products={products!r}: choose 'u8u8', or 'u8s8' where this CPU computes "
                             f"uint8 x int8 exactly (here: {cpu.products()})")
    if layout not in (None, *LAYOUTS):
        raise RuntimeFailure(f"layout={layout!r}: choose one of {', '.join(LAYOUTS)}")
    operands = "u8u8" if products == "u8u8" else Target.native().operands
    rows = any(n.op_type == "im2col_rows" and n.domain == NATIVE_DOMAIN for n in proto.graph.node)
    kept = ("rows",) if not rows else LAYOUTS[:3] if layout in (None, "measure") else (layout,)
    return {k: Sequential(layout_passes(k if rows else "session", operands))(proto).model for k in kept}, operands


def session(model: ModelLike, provider: str = "cpu", native: bool | None = None,
            threads: int | None = None, products: str | None = None, profile: str | None = None,
            conv_search: str = "DEFAULT", cuda_graph: bool = False, layout: str | None = None) -> ort.InferenceSession:
    """An onnxruntime session for ``model`` (a ModelProto, its bytes or a path) on ``provider`` ("cpu", "cuda").

    ``native``: None = the native library when built, else the fallback with a warning; True = the native library
    or ``RuntimeFailure``; False = the pure-Python fallback. ``threads``: onnxruntime's intra-op threads (None:
    one, or every usable CPU for a batched model; see above). ``products``: the serving form's MatMulInteger products
    as "u8u8" (exact everywhere) or "u8s8" (uint8 x int8 for the products where ``cpu`` proves it exact here, where
    ``cpu.products()`` offers it); None: that choice (the fused kernels multiply in their own code, exact on every
    CPU, and take no choice). ``layout``: the one-group integer products as rows, "rows", or each convolution
    one kernel, "fused", or as "columns", or "measure": the three timed here and the fastest kept and remembered
    (``serving.route_cache``), its timings recorded in the session's metadata ``cvm.routes``; None: the layout
    remembered for this model, CPU and thread count, else "measure". A model whose target fixed its layout takes
    neither option (see above). ``profile``: a file-name prefix; the session writes
    onnxruntime's profile (``end_profiling()`` gives its path; ``placement.profiled_placement`` reads where each
    node ran). ``conv_search`` (CUDA): cuDNN's algorithm search, see above. ``cuda_graph`` (CUDA): onnxruntime captures the kernels into a CUDA graph;
    run such a session through ``Bound`` (fixed buffers), with every node on the GPU (the CUDA serving form).
    """
    check_onnxruntime()
    proto = _load(model)
    if provider == "cuda" and (refused := cuda_refusals(proto)):
        raise RuntimeFailure(f"{len(refused)} node(s) would fail on CUDA, {refused[0]}")
    providers = _providers(provider, conv_search, cuda_graph)
    batch = batched_input(proto)
    so = _options(threads or route_cache.default_threads(proto), spin=batch)
    if profile is not None:
        so.enable_profiling, so.profile_file_prefix = True, profile
    library = library_path()
    if library is not None:
        so.register_custom_ops_library(library)
    if uses_serving_kernels(proto):
        if library is None or native is False:
            raise RuntimeFailure("this serving form runs the native im2col and requantize kernels, which need the "
                                 "native custom-op library (see docs/custom_ops.md); export it again without them "
                                 "for a target of products='float' (Target(products='float')) to run it elsewhere")
        candidates, operands = _serving_forms(proto, products, layout)
        if len(candidates) > 1:
            key = route_cache.RouteKey.of(proto, so.intra_op_num_threads, operands)
            try:
                return _measured(candidates, so, providers, key, fresh=layout == "measure")[0]
            except (CVMError, Warning):
                raise
            except Exception as e:
                raise RuntimeFailure(f"onnxruntime refused the model: {one_line(e)}") from None
        (proto,) = candidates.values()
    if fallback.uses_native(proto):
        if native is True and library is None:
            raise RuntimeFailure("native=True, but the native custom-op library was not built with this install "
                                 "(see docs/custom_ops.md)")
        if native is False or library is None:
            if native is None:
                warnings.warn("the native custom-op library was not built with this install (see "
                              "docs/custom_ops.md); the cvm.native ops run through the slow pure-Python fallback",
                              RuntimeWarning, stacklevel=2)
            proto = fallback.to_fallback(proto)
            so.register_custom_ops_library(fallback.library())
    try:
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=providers)
    except Exception as e:
        raise RuntimeFailure(f"onnxruntime refused the model: {one_line(e)}") from None
    if provider == "cuda" and PROVIDERS["cuda"] not in sess.get_providers():
        raise RuntimeFailure(f"onnxruntime could not start CUDAExecutionProvider (the session has "
                             f"{', '.join(sess.get_providers())}); check the CUDA and cuDNN libraries")
    return sess


def run(model: ModelLike | ort.InferenceSession, inputs: dict[str, np.ndarray], provider: str = "cpu",
        native: bool | None = None) -> list[np.ndarray]:
    """Run ``model`` (or an existing session) on ``inputs``; one array per graph output, in order."""
    sess = model if isinstance(model, ort.InferenceSession) else session(model, provider, native)
    try:
        return sess.run(None, inputs)
    except Exception as e:  # noqa: BLE001  (onnxruntime's own exception types)
        raise RuntimeFailure(f"onnxruntime failed to run the model: {one_line(e)}") from None


def run_model(model: ModelLike, data: np.ndarray, provider: str = "cpu",
              native: bool | None = None) -> tuple[list[str], list[np.ndarray]]:
    """Run a single-input model on ``data``; returns the output names and values (input rules: ``feed``). On
    CUDA the data goes through ``Bound`` (IO binding)."""
    model = _load(model)
    sess = session(model, provider, native)
    name = sess.get_inputs()[0].name if sess.get_inputs() else ""
    feeds = feed(sess, data, declared_precision(model, name))
    outs = Bound(sess)(feeds) if provider == "cuda" else run(sess, feeds)
    return [o.name for o in sess.get_outputs()], outs


class Bound:
    """Calls of ``sess`` with IO binding: ``bound(feeds)`` copies each input to the session's device (the
    first provider's: the GPU for CUDA), runs with every output left there, then copies the outputs back.

    When every input and output has a static shape, each calling thread allocates its device buffers once and
    refills them (``OrtValue.update_inplace``): the same addresses every call, as a CUDA graph needs (a session
    made with ``cuda_graph=True``). Otherwise inputs and outputs are bound afresh each call. Threads never share
    buffers, so a session may be called from several threads at once, but not a CUDA-graph session (it replays
    the one set of buffers it was captured with). The device is the provider's first (device 0)."""

    def __init__(self, sess: ort.InferenceSession):
        self.session = sess
        self.device = "cuda" if sess.get_providers()[0] == PROVIDERS["cuda"] else "cpu"
        static = all(isinstance(d, int) for v in (*sess.get_inputs(), *sess.get_outputs()) for d in v.shape)
        self.static = static and all(o.type in _NUMPY_TYPES for o in sess.get_outputs())
        self.local = threading.local()

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            if self.static:
                return self._fixed(feeds)
            binding = self.session.io_binding()
            for name, value in feeds.items():
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            for o in self.session.get_outputs():
                binding.bind_output(o.name, self.device)
            self.session.run_with_iobinding(binding)
            return binding.copy_outputs_to_cpu()
        except CVMError:
            raise
        except Exception as e:  # noqa: BLE001  (onnxruntime's own exception types)
            raise RuntimeFailure(f"onnxruntime failed to run the model: {one_line(e)}") from None

    def _fixed(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        for i in self.session.get_inputs():
            given, want = feeds[i.name], np.dtype(_NUMPY_TYPES.get(i.type, np.void))
            if given.shape != tuple(i.shape) or given.dtype != want:
                raise RuntimeFailure(f"input {i.name} is {given.dtype} {given.shape}; the session takes {want} "
                                     f"{tuple(i.shape)}")
        state = getattr(self.local, "state", None)
        if state is None:
            binding, inputs, held = self.session.io_binding(), {}, []
            for i in self.session.get_inputs():  # on the CPU the OrtValue is the array itself: a private copy
                held.append(np.array(feeds[i.name], order="C", copy=True))
                inputs[i.name] = ort.OrtValue.ortvalue_from_numpy(held[-1], self.device, 0)
                binding.bind_ortvalue_input(i.name, inputs[i.name])
            outputs = [ort.OrtValue.ortvalue_from_shape_and_type(o.shape, _NUMPY_TYPES[o.type], self.device, 0)
                       for o in self.session.get_outputs()]
            for o, value in zip(self.session.get_outputs(), outputs):
                binding.bind_ortvalue_output(o.name, value)
            state = self.local.state = (binding, inputs, outputs, held)
        else:
            for name, value in state[1].items():
                value.update_inplace(np.ascontiguousarray(feeds[name]))
        binding, _, outputs, _ = state
        self.session.run_with_iobinding(binding)
        return [value.numpy().copy() for value in outputs]


def feed(sess: ort.InferenceSession, data: np.ndarray, precision: int | None = None) -> dict[str, np.ndarray]:
    """``data`` as the input of a single-input session whose model declares the input ``precision`` (if any).

    With a precision, integer data is taken as the reference executor takes it (``integer_input``). An integer
    ``data`` narrower than the model's input type is widened (int8 -> int32, as the CVM runtime reads int8
    inputs); float data for a float32 input (an export with float edges) is rounded to float32, as ``cvm-onnx
    run`` rounds it before quantizing, and integer data for it refused (it would be taken as float values); any
    other mismatch is a ``RuntimeFailure``, as is an output that is not a tensor of numbers.
    """
    inputs = sess.get_inputs()
    if len(inputs) != 1:
        raise RuntimeFailure(f"the model has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                             f"run_model feeds exactly one")
    if bad := [o for o in sess.get_outputs() if o.type not in NUMERIC_TENSORS]:
        raise RuntimeFailure([Problem(o.name, f"output of type {o.type}: run gives tensors of numbers only")
                              for o in bad])
    want = np.dtype(_NUMPY_TYPES.get(inputs[0].type, np.void))
    if precision is not None and want.kind != "f":
        data = integer_input(data, precision, inputs[0].name)
    if want.kind == "f" and data.dtype.kind != "f":  # integers are not taken for values to quantize
        raise RuntimeFailure(f"input {inputs[0].name} is {inputs[0].type}; got {data.dtype} data, which would be "
                             "taken as float values: give float data (an export with float input, convert "
                             "--float-io, quantizes it itself), or the integers to the export without --float-io")
    if data.dtype != want:
        if not np.can_cast(data.dtype, want, casting="same_kind" if data.dtype.kind == want.kind == "f" else "safe"):
            raise RuntimeFailure(f"input {inputs[0].name} is {inputs[0].type}; got {data.dtype} data")
        data = data.astype(want)
    check_shape(inputs[0].name, inputs[0].shape, data.shape)
    return {inputs[0].name: data}


def check_shape(name: str, shape: list, given: tuple[int, ...]) -> None:
    """``RuntimeFailure`` unless ``given`` fits the input's static ``shape``; a batched model (first dimension
    N > 1) is told apart: give N samples, or convert without --batch."""
    if len(shape) == len(given) and all(not isinstance(d, int) or d == g for d, g in zip(shape, given)):
        return
    expected = tuple(shape)
    if len(shape) == len(given) and shape[1:] == list(given[1:]) and isinstance(shape[0], int) and shape[0] > 1:
        raise RuntimeFailure(f"the model takes a batch of {shape[0]} samples, shape {expected}; got {given[0]}: give "
                             f"{shape[0]} samples, or convert the CVM model without --batch", where=name)
    raise RuntimeFailure(f"input shape {tuple(given)} must be {expected}", where=name)


def declared_precision(model: onnx.ModelProto, name: str) -> int | None:
    """The precision the exporter declares for input ``name`` (metadata of its clamped value, or of the input
    itself in a serving form that merged the clamp away), if any."""
    for vi in [*model.graph.input, *model.graph.value_info]:
        for text in (p.value for p in vi.metadata_props if p.key == PRECISION and vi.name in (name, f"{name}:clamped")):
            if precision_of(text) is None:
                raise FormatError(f"metadata {PRECISION}={text!r} is not a precision in [1, 32]", where=vi.name)
            return precision_of(text)
    return None


NUMERIC_TENSORS = {f"tensor({t})" for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                              "uint64", "float16", "bfloat16", "float", "double")}
_NUMPY_TYPES = {"tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32,
                "tensor(int64)": np.int64, "tensor(uint8)": np.uint8, "tensor(float)": np.float32}
