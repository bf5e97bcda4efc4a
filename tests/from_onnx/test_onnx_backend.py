"""The ONNX project's backend node tests as a suite of the importer: every integer case is exact, or refused for
a reason on the allow-list below, which says why no exact CVM form exists.

The cases are generated at test time by the installed onnx (``load_model_tests(kind='node')``), never copied
here, each at the newest opset the installed onnxruntime reads (``readable_node_test``: a test of an op version
newer than that runs at the older version where onnx's reference implementation of it gives the test's
outputs, else it is left out). A test is integer when every output is an integer tensor (not bool); it gives one case per integer input
fed as an array: that input stays the graph input, every other input becomes an initializer holding its test
value. The case is imported with the input precision its test value needs and run on the reference executor
and, exported again, on onnxruntime; both must equal the test's expected outputs element for element.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from functools import cache

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import numpy_helper
from support import readable_node_test

from cvm_onnx.converters.from_onnx import from_onnx
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.sessions import run

INTEGER = {T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.UINT16, T.UINT32, T.UINT64}

#: (test name pattern, refusal reason pattern, why no exact CVM form exists). A refused case passes only when
#: every problem reported matches an entry whose name pattern matches the test; an entry nothing matches fails
#: the suite, so the list shrinks as rules are added.
ALLOWED = [
    (r"test_(bitcast_uint32_to_int32|bitshift_right_int32_negative_input)", r"input precision 33 must lie in \[1, 32\]",
     "the test's input needs 33 bits (2^31 or -2^31); CVM's values are 32-bit, |x| <= 2^31 - 1"),
    (r"test_bitshift_left_int32_(negative_shift|overflow|shift_ge_width)", r"its table reaches 2147483648",
     "the shifts the variable amount may take give 2^31 (1 << 31), beyond CVM's 32 bits"),
    (r"test_bitshift_left_int32_overflow", r"outside int32 .* ONNX wraps them",
     "the shift wraps at 32 bits for inputs of the declared range, too many for a table"),
    (r"test_bitshift_right_int32_negative_input", r"its table reaches 2147483648",
     "the constant x holds -2^31, beyond CVM's 32 bits"),
    (r"test_bitwise_not_2d", r"values may reach 2147483648, beyond CVM's 32 bits",
     "~x = -1 - x of a 32-bit input reaches -2^31, beyond CVM's 32 bits"),
    (r"test_bitwise_(and|or|xor)_.*", r"no arithmetic form, and a table over the variable operand's \d+ values",
     "bitwise And/Or/Xor of a variable over a wide range: no arithmetic form, too many values for a table"),
    (r"test_sub_uint(8|16|32|64)", r"outside uint\d+ .* ONNX wraps them",
     "unsigned Sub can wrap within the declared input range (ONNX wraps, CVM would not)"),
    (r"test_pow_types_int(32|64)_int(32|64)", r"a variable exponent that may be negative",
     "the declared range of the exponent holds negative values: integers to negative powers are undefined"),
    (r"test_(tril|triu)_zero", r"static shape|CVM has no empty tensors", "an empty tensor: CVM has none"),
    (r"test_constantofshape_.*", r"shape \(the output shape\) must be a constant",
     "the output's shape is the input's value"),
    (r"test_(edge|reflect|wrap)_pad", r"Pad pads must be a constant", "the output's shape depends on the pads' values"),
    (r"test_cum(sum|prod)_.*", r"axis must be a constant scalar",
     "the axis decides which elements combine: a variable one has no fixed CVM form"),
    (r"test_range_.*", r"no CVM op for ONNX (Ceil|Loop)|shape from values: Range|float Div is not integer division",
     "the output's shape depends on the inputs' values"),
    (r"test_unique_.*", r"no CVM op for ONNX Unique", "the output's shape depends on the input's values"),
    (r"test_top_k_.*", r"TopK k must be a constant scalar",
     "k fed as the model's input: the output's shape depends on its value"),
    (r"test_image_decoder_.*", r"no CVM op for ONNX ImageDecoder", "decodes compressed image bytes"),
    (r"test_nonmaxsuppression_.*", r"no CVM op for ONNX NonMaxSuppression",
     "float boxes and IoU, index outputs: CVM's non_max_suppression has another contract (integer rows, percent IoU)"),
    (r"test_(qlinearconv|qlinearmatmul_.*|quantizelinear.*)", r"computed at run time: CVM's conv2d|computed at "
     r"run time: CVM needs (it )?constant", "a zero point or weight fed as the model's input: the quantized front needs "
     "them constant (it folds them into the weights and the requantization)"),
    (r"test_qlinearconv", r"the weight minus its zero point reaches 255",
     "uint8 weights of zero point 0 reach 255 (9 bits): CVM's conv2d takes 8-bit weights"),
    (r"test_qlinearmatmul_3D_.*", r"dense takes one weight matrix", "a batched right operand: dense takes one matrix"),
    (r"test_quantizelinear_blocked_.*", r"blocked quantization", "a scale per block of elements: no CVM form here"),
]


@dataclass(frozen=True, eq=False)
class Case:
    """One test with input ``kept`` as the graph input, the others folded into initializers."""

    test: str
    kept: int
    model: onnx.ModelProto
    data: np.ndarray
    expected: tuple[np.ndarray, ...]

    @property
    def id(self) -> str:
        return f"{self.test}[{self.kept}]"


def _elem_type(vi: onnx.ValueInfoProto) -> int | None:
    return vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else None


def _folded(model: onnx.ModelProto, kept: int, values: list) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inputs = list(m.graph.input)
    del m.graph.input[:]
    m.graph.input.append(inputs[kept])
    for k, (vi, v) in enumerate(zip(inputs, values)):
        if k != kept:
            m.graph.initializer.append(v if isinstance(v, onnx.TensorProto) else numpy_helper.from_array(np.asarray(v),
                                                                                                         vi.name))
            m.graph.initializer[-1].name = vi.name
    return m


@cache
def cases() -> tuple[Case, ...]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own overflow warnings
        tests = load_model_tests(kind="node")
    out = []
    for t in sorted(tests, key=lambda t: t.name):
        g = t.model.graph
        if not g.input or not all(_elem_type(o) in INTEGER for o in g.output):
            continue
        inputs, outputs = t.data_sets[0]
        model = readable_node_test(t.model, (inputs, outputs))
        if model is None:  # an op newer than the installed onnxruntime reads
            continue
        for k, vi in enumerate(g.input):
            if _elem_type(vi) in INTEGER and isinstance(inputs[k], (np.ndarray, np.generic)):
                out.append(Case(t.name, k, _folded(model, k, inputs), np.asarray(inputs[k]),
                                tuple(np.asarray(o) for o in outputs)))
    return tuple(out)


@dataclass(frozen=True)
class Outcome:
    kind: str  # exact, wrong, refused, crash
    detail: str = ""
    reasons: tuple[str, ...] = ()


def _precision(data: np.ndarray) -> int:
    """The smallest input precision holding every test value (33 when none does: CVM's input is 32-bit)."""
    peak = int(np.abs(data.astype(np.int64) if data.dtype != np.uint64 else data).max(initial=0))
    return min(peak.bit_length() + 1, 33)


def _differs(got: list[np.ndarray], want: tuple[np.ndarray, ...]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g.size != w.size or not np.array_equal(np.asarray(g, np.int64).reshape(w.shape), w.astype(np.int64)):
            return f"output {k}: got {np.asarray(g).reshape(-1)[:8]}, expected {w.reshape(-1)[:8]}"
    return None


def outcome(case: Case) -> Outcome:
    try:
        graph = from_onnx(case.model, input_precision=_precision(case.data))
    except UnsupportedError as e:
        return Outcome("refused", str(e), tuple(p.rule for p in e.problems))
    except Exception as e:  # noqa: BLE001  (anything else is a crash of the importer)
        return Outcome("crash", f"{type(e).__name__}: {e}")
    feed = {"data": case.data.astype(np.int32).reshape(graph.nodes[graph.inputs[0]].outputs[0].shape)}
    try:
        if (bad := _differs(execute(graph, feed), case.expected)) is not None:
            return Outcome("wrong", f"reference executor: {bad}")
        if (bad := _differs(run(to_onnx(graph), feed), case.expected)) is not None:
            return Outcome("wrong", f"onnxruntime: {bad}")
    except Exception as e:  # noqa: BLE001
        return Outcome("crash", f"{type(e).__name__}: {e}")
    return Outcome("exact")


def allowed(case: Case, reason: str) -> tuple[str, str, str] | None:
    return next((a for a in ALLOWED if re.fullmatch(a[0], case.test) and re.search(a[1], reason)), None)


def test_every_case_is_exact_or_refused_for_an_allowed_reason_and_every_allow_list_entry_is_used():
    """One test over every case (generating them takes seconds: done once, when it runs, not in each worker's
    collection), naming each case that fails. An allow-list entry naming a test that runs here (not one of an op
    version newer than the installed onnxruntime reads) must explain a refusal."""
    failures, used = [], set()
    for case in cases():
        out = outcome(case)
        if out.kind not in ("exact", "refused"):
            failures.append(f"{case.id}: {out.kind}: {out.detail}")
            continue
        entries = [allowed(case, r) for r in out.reasons]
        used.update(entries)
        if None in entries:
            unexplained = [r for r, a in zip(out.reasons, entries) if a is None]
            failures.append(f"{case.id} refused for reasons not on the allow-list: {unexplained}")
    assert not failures, "\n".join(failures)
    here = [a for a in ALLOWED if any(re.fullmatch(a[0], c.test) for c in cases())]
    assert [a for a in here if a not in used] == []
