"""Hostile ONNX files (issue 14): every node is held to its op's schema before any import rule runs, rules read
typed attributes, versions are those onnx and onnxruntime read. Each case below crashed the importer (exit 70)
or was accepted although onnxruntime refuses it; now each is one clear error naming the node."""
from __future__ import annotations

import functools
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from support import needs_fallback, readable_node_test
from support.fuzz import EXTREMES, Case, Seeds, bounded, onnx_seeds

from cvm_onnx.app.api import import_onnx
from cvm_onnx.app.cli import main
from cvm_onnx.converters.from_onnx.checks import supported_versions
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.errors import CVMError, FormatError, UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model

IR, OPSET = supported_versions()


def int_model(nodes, shape=(1, 4), opset=17, inits=(), out_type=T.INT32) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("data", T.INT32, list(shape))],
                              [helper.make_tensor_value_info("y", out_type, None)], list(inits))
    return onnx_model(graph, opset)


def convert(tmp_path, model: onnx.ModelProto, capsys) -> tuple[int, list[str]]:
    """``cvm-onnx convert`` of the model: the exit code and the lines on stderr."""
    onnx.save(model, tmp_path / "m.onnx")
    code = main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out")])
    return code, capsys.readouterr().err.splitlines()


def node(op, ins, **attrs):
    return helper.make_node(op, ins, ["y"], name="n", **attrs)


def with_attr(n: onnx.NodeProto, name, value, clear_type=False) -> onnx.NodeProto:
    a = helper.make_attribute(name, value)
    if clear_type:
        a.type = onnx.AttributeProto.UNDEFINED
    n.attribute.append(a)
    return n


def conv_integer_cleared_dilations():
    conv = with_attr(helper.make_node("ConvInteger", ["x8", "w"], ["y"], name="n"), "dilations", [1, 1], True)
    return int_model([helper.make_node("Cast", ["data"], ["x8"], to=T.INT8), conv], (1, 1, 4, 4),
                     inits=[numpy_helper.from_array(np.ones((1, 1, 2, 2), np.int8), "w")])


# (model, the one problem line): each crashed with an internal error (exit 70) before
INTERNAL_ERRORS = {
    "Cast to as a list": (int_model([with_attr(node("Cast", ["data"]), "to", [6, 6])]),
                          "format error: n: Cast: attribute to must be INT, got INTS"),
    "Cast to as a tensor": (int_model([with_attr(node("Cast", ["data"]), "to",
                                                 numpy_helper.from_array(np.array([6])))]),
                            "format error: n: Cast: attribute to must be INT, got TENSOR"),
    "Concat without axis": (int_model([node("Concat", ["data", "data"])]),
                            "format error: n: Concat: attribute axis is required"),
    "Concat input ''": (int_model([node("Concat", ["data", ""], axis=0)]),
                        "format error: n: Concat: input 1 (inputs) is required, but empty"),
    "Max input ''": (int_model([node("Max", ["data", ""])]),
                     "format error: n: Max: input 1 (data_0) is required, but empty"),
    "MaxPool strides as a string": (int_model([node("MaxPool", ["data"], kernel_shape=[2, 2], strides="ab")],
                                              (1, 1, 4, 4)),
                                    "format error: n: MaxPool: attribute strides must be INTS, got STRING"),
    "ConvInteger dilations of no type": (conv_integer_cleared_dilations(),
                                         "format error: n: ConvInteger: attribute dilations must be INTS, "
                                         "got UNDEFINED"),
}

# accepted (exit 0) before, though onnxruntime refuses them or computes something else
LOOSE = {
    "MaxPool without kernel_shape": (int_model([node("MaxPool", ["data"])], (1, 1, 4, 4)),
                                     "format error: n: MaxPool: attribute kernel_shape is required"),
    "Pad with 1 pads value": (int_model([node("Pad", ["data", "p"])],
                                        inits=[numpy_helper.from_array(np.array([1], np.int64), "p")]),
                              "unsupported: n (Pad): Pad pads [1] must hold 2 values per padded axis (2 distinct "
                              "axes)"),
    "Abs axis": (int_model([node("Abs", ["data"], axis=1)]),
                 "format error: n: Abs: unknown attribute 'axis' (known: none)"),
    "Cast group": (int_model([node("Cast", ["data"], to=T.INT32, group=1)]),
                   "format error: n: Cast: unknown attribute 'group' (known: to)"),
    "default opset 999": (int_model([node("Relu", ["data"])], opset=999),
                          "format error: model: ai.onnx opset 999 is not one the installed onnx and onnxruntime "
                          f"read (1 to {OPSET})"),
}


def versions(**fields) -> onnx.ModelProto:
    m = int_model([node("Relu", ["data"])])
    for k, v in fields.items():
        setattr(m, k, v)
    return m


def two_default_imports(domain: str) -> onnx.ModelProto:
    m = int_model([node("Relu", ["data"])])
    m.opset_import.append(helper.make_opsetid(domain, 14))
    return m


def value_info_of_type(elem_type: int, where: str) -> onnx.ModelProto:
    m = int_model([node("Relu", ["data"])])
    if where == "output":
        m.graph.output[0].type.tensor_type.elem_type = elem_type
    else:
        m.graph.value_info.append(helper.make_tensor_value_info("y", elem_type, [1, 4]))
    return m


LOOSE |= {
    "ir_version 99": (versions(ir_version=99), "format error: model: ir_version 99 is not one the installed onnx "
                                               f"and onnxruntime read (3 to {IR})"),
    "ir_version 2^62": (versions(ir_version=1 << 62), f"format error: model: ir_version {1 << 62} is not one the "
                                                      f"installed onnx and onnxruntime read (3 to {IR})"),
    "two '' imports": (two_default_imports(""), "format error: model: opset_import names domain ai.onnx 2 times "
                                                "(once at most)"),
    "'' and ai.onnx imports": (two_default_imports("ai.onnx"), "format error: model: opset_import names domain "
                                                               "ai.onnx 2 times (once at most)"),
    "value_info type 0": (value_info_of_type(0, "value_info"), "format error: y: declares element type 0, which is "
                                                               "no ONNX tensor type"),
    "value_info type 99": (value_info_of_type(99, "value_info"), "format error: y: declares element type 99, which "
                                                                 "is no ONNX tensor type"),
    "output type 0": (value_info_of_type(0, "output"), "format error: y: declares element type 0, which is no ONNX "
                                                       "tensor type"),
}


@pytest.mark.parametrize("case", list(INTERNAL_ERRORS) + list(LOOSE))
def test_hostile_node_or_header_is_one_clear_error(tmp_path, capsys, case):
    model, line = (INTERNAL_ERRORS | LOOSE)[case]
    code, err = convert(tmp_path, model, capsys)
    assert err == [line]
    assert code == (FormatError if line.startswith("format") else UnsupportedError).exit_code
    assert not (tmp_path / "out").exists()


def test_the_version_limits_are_those_onnxruntime_reads(monkeypatch):
    """The limits are probed: onnxruntime runs a model at both; where the installed onnx knows later versions
    (here it claims ten more of each, as a newer onnx would) the probe stops at the last that onnxruntime runs."""
    import onnxruntime as ort

    def loads(ir, opset):
        try:
            m = versions(ir_version=ir)
            m.opset_import[0].version = opset
            ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            return True
        except Exception:  # noqa: BLE001
            return False

    assert loads(IR, OPSET) and loads(IR, 14)  # Relu of int32 needs opset 14
    monkeypatch.setattr(onnx, "IR_VERSION", IR + 10)
    monkeypatch.setattr(onnx.defs, "onnx_opset_version", lambda: OPSET + 10)
    ir, opset = supported_versions.__wrapped__()  # not the cached answer
    assert loads(ir, 14) and not loads(ir + 1, 14)
    assert loads(ir, opset) and not loads(ir, opset + 1)


def test_external_data_location_with_a_nul_byte_is_a_format_error(tmp_path, capsys):
    """os.path.realpath raised ValueError ("embedded null byte") in checks.external_path."""
    (tmp_path / "data.bin").write_bytes(np.ones(4, np.int32).tobytes())
    w = numpy_helper.from_array(np.ones((1, 4), np.int32), "w")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    w.external_data.add(key="location", value="data.bin\x00../../etc/passwd")
    code, err = convert(tmp_path, int_model([node("Add", ["data", "w"])], inits=[w]), capsys)
    assert code == FormatError.exit_code
    assert err == ["format error: initializer 'w': tensor external data location "
                   "'data.bin\\x00../../etc/passwd' contains a NUL byte"]


# -- native kernels: absent inputs are refused when the model loads, in a child process (this one would die) ------
def native_model(op: str, absent: int) -> tuple[onnx.ModelProto, np.ndarray]:
    """A model of one cvm.native op fed by the graph input, whose input ``absent`` is the empty name ''."""
    from cvm_onnx.native import DOMAIN, VERSION

    arity, shape = {"non_max_suppression": (2, [1, 2, 6]), "get_valid_counts": (1, [1, 2, 6]),
                    "cvm_lut": (2, [1, 2])}[op]
    ins = ["data"] * arity
    ins[absent] = ""
    outs = ["c", "y"] if op == "get_valid_counts" else ["y"]
    graph = helper.make_graph([helper.make_node(op, ins, outs, name="n", domain=DOMAIN)], "g",
                              [helper.make_tensor_value_info("data", T.INT32, shape)],
                              [helper.make_tensor_value_info(o, T.INT32, None) for o in outs])
    model = onnx_model(graph, 17, {DOMAIN: VERSION})
    return model, np.zeros(shape, np.int32)


@pytest.mark.parametrize("native", [True, pytest.param(False, marks=needs_fallback)], ids=["native", "fallback"])
@pytest.mark.parametrize("op, absent", [("non_max_suppression", 0), ("non_max_suppression", 1),
                                        ("get_valid_counts", 0), ("cvm_lut", 0), ("cvm_lut", 1)])
def test_absent_input_of_a_native_op_is_refused_not_a_segfault(tmp_path, op, absent, native):
    """A native op whose input is '' is refused with one error, never run (a non_max_suppression whose data input
    was '' once died of SIGSEGV: its absent input was read through a null value)."""
    import subprocess
    import sys

    model, x = native_model(op, absent)
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, warnings; warnings.simplefilter('ignore'); from cvm_onnx.app import cli; from cvm_onnx.runtime import sessions; "
            f"sessions.library_path = (lambda: None) if {not native} else sessions.library_path; "
            "sys.exit(cli.main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "run", str(tmp_path / "m.onnx"), "--input",
                           str(tmp_path / "x.npy"), "--output", str(tmp_path / "o.npz")],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.splitlines()
    assert done.returncode == 5, (done.returncode, done.stderr[-500:])
    assert len(lines) == 1 and lines[0].startswith("runtime error: onnxruntime refused the model") and \
        "INVALID_GRAPH" in lines[0]
    assert not (tmp_path / "o.npz").exists()


# -- run: external data from the model's own folder, with the importer's checks --------------------------------------
W = np.array([[3, -1, 4, -1]], np.int32)


def external_add_model(folder, location="data.bin", offset=0, length=None) -> None:
    """model.onnx in ``folder``: y = data + w, w stored in ``location`` (written there, holding W)."""
    w = numpy_helper.from_array(W, "w")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    w.external_data.add(key="location", value=location)
    w.external_data.add(key="offset", value=str(offset))
    if length is not None:
        w.external_data.add(key="length", value=str(length))
    onnx.save(int_model([node("Add", ["data", "w"])], inits=[w]), folder / "model.onnx")


def run_cli(tmp_path, model, capsys) -> tuple[int, list[str]]:
    np.save(tmp_path / "x.npy", np.array([[1, 2, 3, 4]], np.int32))
    code = main(["run", str(model), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "o.npz")])
    return code, capsys.readouterr().err.splitlines()


def test_run_reads_external_data_from_the_model_folder_not_the_working_directory(tmp_path, capsys, monkeypatch):
    """run handed onnxruntime the model as bytes, so data.bin was looked up in the working directory: run from a
    folder holding another data.bin, it exited 0 with wrong values."""
    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "model" / "data.bin").write_bytes(W.tobytes())
    (tmp_path / "elsewhere" / "data.bin").write_bytes((W * 100).tobytes())
    external_add_model(tmp_path / "model")
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, err = run_cli(tmp_path, tmp_path / "model" / "model.onnx", capsys)
    assert (code, err) == (0, [])
    assert np.array_equal(np.load(tmp_path / "o.npz")["y"], W + [1, 2, 3, 4])
    from cvm_onnx.runtime import sessions

    [y] = sessions.run(tmp_path / "model" / "model.onnx", {"data": np.array([[1, 2, 3, 4]], np.int32)})
    assert np.array_equal(y, W + [1, 2, 3, 4])


@pytest.mark.parametrize("location, offset, length, rule", [
    ("../outside.bin", 0, None, "leaves the model's directory"),
    ("link.bin", 0, None, "leaves the model's directory"),
    ("data.bin\x00x", 0, None, "contains a NUL byte"),
    ("data.bin", 8, 16, "external data [8, 24) lies outside its file of 16 bytes"),
    ("data.bin", 8, None, "external data has 8 bytes, but shape [1, 4] of 4-byte values needs 16"),
    ("ABSOLUTE", 0, None, "must be a relative path inside the model's directory"),
])
def test_run_refuses_external_data_as_the_importer_does(tmp_path, capsys, monkeypatch, location, offset, length,
                                                        rule):
    (tmp_path / "model").mkdir()
    (tmp_path / "outside.bin").write_bytes(W.tobytes())
    (tmp_path / "model" / "data.bin").write_bytes(W.tobytes())
    (tmp_path / "model" / "link.bin").symlink_to(tmp_path / "outside.bin")
    external_add_model(tmp_path / "model", str(tmp_path / "outside.bin") if location == "ABSOLUTE" else location,
                       offset, length)
    monkeypatch.chdir(tmp_path)  # where ../outside.bin would be found relative to the working directory
    code, err = run_cli(tmp_path, tmp_path / "model" / "model.onnx", capsys)
    assert code == FormatError.exit_code and len(err) == 1
    assert err[0].startswith("format error: initializer 'w': tensor ") and rule in err[0]
    assert not (tmp_path / "o.npz").exists()


def test_run_of_a_string_output_is_a_runtime_error(tmp_path, capsys):
    """A node turned into a Constant with a string value made a string graph output: write_npz raised ValueError
    (exit 70)."""
    m = int_model([helper.make_node("Constant", [], ["y"], name="n",
                                    value=helper.make_tensor("v", T.STRING, [1], [b"a"]))], out_type=T.STRING)
    onnx.save(m, tmp_path / "m.onnx")
    code, err = run_cli(tmp_path, tmp_path / "m.onnx", capsys)
    assert (code, err) == (5, ["runtime error: y: output of type tensor(string): run gives tensors of numbers only"])


@pytest.mark.parametrize("value", ["abc", "0", "-3", "99", "9" * 5000])
def test_run_with_a_declared_input_precision_that_is_none_is_a_format_error(tmp_path, capsys, value):
    """int() of the exporter's input precision metadata raised ValueError (exit 70) for 'abc'; 0 and -3 made a
    negative shift (ValueError)."""
    m = int_model([node("Relu", ["data"])])
    vi = helper.make_tensor_value_info("data:clamped", T.INT32, [1, 4])
    vi.metadata_props.add(key="cvm.precision", value=value)
    m.graph.value_info.append(vi)
    onnx.save(m, tmp_path / "m.onnx")
    code, err = run_cli(tmp_path, tmp_path / "m.onnx", capsys)
    assert code == FormatError.exit_code
    assert err == [f"format error: data:clamped: metadata cvm.precision={value!r} is not a precision in [1, 32]"]


# -- property: every import rule's op type under mutated attributes and input names ---------------------------------
FLOATS = (T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16)


def integer_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose float inputs, outputs, value_info and initializers are int32 (values rounded), so that the
    import rules, not the input check, meet the node."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in [*m.graph.input, *m.graph.output, *m.graph.value_info]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in FLOATS:
            vi.type.tensor_type.elem_type = T.INT32
    for k, t in enumerate(m.graph.initializer):
        if t.data_type in FLOATS:
            v = np.clip(np.nan_to_num(numpy_helper.to_array(t).astype(np.float64)), -(1 << 30), 1 << 30)
            m.graph.initializer[k].CopyFrom(numpy_helper.from_array(np.rint(v).astype(np.int32), t.name))
    return m


@functools.cache
def rule_seeds() -> dict[str, bytes]:
    """Up to 3 single-node backend tests of onnx for each import rule's op type (standard domain) in integer
    form, and the exporter's models of the reliability seeds (every CVM op in the cvm domain, the cvm.native ops),
    function and flat form."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    from cvm_onnx.converters.from_onnx import RULES

    ONNX_SEEDS = onnx_seeds()

    ops = {op for domain, op in RULES if domain == ""}
    seeds, taken = {}, Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tests = load_model_tests(kind="node")
    for t in sorted(tests, key=lambda t: t.name):
        nodes = t.model.graph.node
        if len(nodes) == 1 and nodes[0].op_type in ops and taken[nodes[0].op_type] < 3 and \
                (model := readable_node_test(t.model)) is not None:
            taken[nodes[0].op_type] += 1
            seeds[t.name] = integer_form(model).SerializeToString()
    for name, data in ONNX_SEEDS.items():  # the native ops called in the cvm domain too (same import rule)
        m = onnx.load_from_string(data)
        if any(n.domain == "cvm.native" for n in m.graph.node) and "flat" not in name:
            for n in m.graph.node:
                if n.domain == "cvm.native":  # as a function of the model (its body: a stand-in, never run here)
                    n.domain = "cvm"
                    ins, outs = [f"i{k}" for k in range(len(n.input))], [f"o{k}" for k in range(len(n.output))]
                    m.functions.append(helper.make_function(
                        "cvm", n.op_type, ins, outs, [helper.make_node("Identity", ["i0"], [o]) for o in outs],
                        [helper.make_opsetid("", 17)], [a.name for a in n.attribute]))
            if not any(o.domain == "cvm" for o in m.opset_import):
                m.opset_import.append(helper.make_opsetid("cvm", 1))
            seeds[f"{name}/cvm-domain"] = m.SerializeToString()
    return Seeds(seeds | dict(ONNX_SEEDS))


def _attr_values(draw, name: str) -> onnx.AttributeProto:
    """An attribute ``name`` of any type, values at the extremes (or with its type field cleared)."""
    ints = st.sampled_from([v for v in EXTREMES if -(1 << 63) <= v < (1 << 63)])
    kind = draw(st.sampled_from(["int", "ints", "float", "floats", "string", "strings", "tensor", "untyped"]))
    value = {"int": lambda: draw(ints), "ints": lambda: draw(st.lists(ints | st.integers(-2, 4), max_size=6)),
             "float": lambda: draw(st.sampled_from([0.5, float("nan"), float("inf"), -1.0, 1e30, 2.0])),
             "floats": lambda: draw(st.lists(st.sampled_from([0.5, float("nan"), 2.0, -1.0]), min_size=1,
                                             max_size=5)),
             "string": lambda: draw(st.sampled_from(["", "x", "NOTSET", "SAME_UPPER", "constant", "nearest",
                                                    "\x00", "é"])),
             "strings": lambda: ["a", "b"],
             "tensor": lambda: numpy_helper.from_array(np.array(draw(st.lists(ints, min_size=1, max_size=3)),
                                                                np.int64), "t"),
             "untyped": lambda: draw(ints)}[kind]()
    types = {"int": "INT", "ints": "INTS", "float": "FLOAT", "floats": "FLOATS", "string": "STRING",
             "strings": "STRINGS", "tensor": "TENSOR", "untyped": "INT"}
    a = helper.make_attribute(name, value, attr_type=getattr(onnx.AttributeProto, types[kind]))
    if kind == "untyped":
        a.type = onnx.AttributeProto.UNDEFINED
    return a


def _schema_attrs(n: onnx.NodeProto, opset: int) -> list[str]:
    domain = "" if n.domain in ("", "ai.onnx") else n.domain
    try:
        return list(onnx.defs.get_schema(n.op_type, max(opset, 1), domain).attributes)
    except onnx.defs.SchemaError:
        return []


@st.composite
def mutated_nodes(draw, seeds: dict[str, bytes]) -> Case:
    """A seed whose nodes get 1 to 3 mutations of their attributes (dropped, retyped, set to extreme values, added
    from the op's schema or unknown) or input names (renamed to '' or to another tensor, dropped, added)."""
    name = draw(st.sampled_from(sorted(seeds)))
    model = onnx.load_from_string(seeds[name])
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    tensors = sorted({x for n in model.graph.node for x in [*n.input, *n.output] if x}
                     | {v.name for v in model.graph.input} | {t.name for t in model.graph.initializer})
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        k = draw(st.integers(0, len(model.graph.node) - 1))
        n = model.graph.node[k]
        kind = draw(st.sampled_from(["drop", "retype", "extreme", "add", "input ''", "input rename", "input drop",
                                     "input add"]))
        attrs = [a.name for a in n.attribute]
        if kind in ("drop", "extreme", "retype") and not attrs:
            kind = "add"
        if kind == "drop":
            i = draw(st.integers(0, len(attrs) - 1))
            steps.append(f"drop {n.name or k}.{attrs[i]}")
            del n.attribute[i]
        elif kind in ("retype", "extreme", "add"):
            pool = attrs if kind != "add" else _schema_attrs(n, opset) + ["bogus", "axis", "group"]
            attr = draw(st.sampled_from(pool or ["bogus"]))
            new = _attr_values(draw, attr)
            old = next((a for a in n.attribute if a.name == attr), None)
            if kind == "extreme" and old is not None and old.type in (onnx.AttributeProto.INT,
                                                                       onnx.AttributeProto.INTS):
                new = helper.make_attribute(attr, draw(st.sampled_from([-1, 0, 1 << 40, -(1 << 40), 99]))
                                            if old.type == onnx.AttributeProto.INT else
                                            draw(st.lists(st.sampled_from([-1, 0, 1 << 40, 99, 2]), max_size=5)),
                                            attr_type=old.type)
            if old is not None:
                old.CopyFrom(new)
            else:
                n.attribute.append(new)
            steps.append(f"{kind} {n.name or k}.{attr} = {helper.get_attribute_value(new) if new.type else '?'!r:.40}")
        elif kind == "input add":
            n.input.append(draw(st.sampled_from(tensors + [""])))
            steps.append(f"add input {n.input[-1]!r} to {n.name or k}")
        elif not n.input:
            steps.append("keep")
        else:
            i = draw(st.integers(0, len(n.input) - 1))
            if kind == "input drop":
                del n.input[i]
            else:
                n.input[i] = "" if kind == "input ''" else draw(st.sampled_from(tensors))
            steps.append(f"{kind} {n.name or k}.input[{i}]")
    return Case(name, tuple(steps), (model.SerializeToString(),))


def check_mutant(case: Case):
    """The converter on a mutated .onnx file: success, or one of our errors whose every problem is one line naming
    where (a node, a tensor, the model); within the reliability bounds (no internal error, hang or blow-up)."""
    (data,) = case.files
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.onnx"
        path.write_bytes(data)

        def convert():
            try:
                return to_onnx(import_onnx(path))
            except CVMError as e:
                assert all(p.where and "\n" not in str(p) for p in e.problems), e.problems
                raise

        return bounded(convert, len(data))


def test_rule_seeds_cover_every_import_rule():
    """Every rule of the standard domain (onnx's backend tests have one for each op type) and of the project's
    own domains; the contrib domain com.microsoft of the quantized front has no such seeds yet."""
    from cvm_onnx.converters.from_onnx import RULES

    covered = {(n.domain, n.op_type) for data in rule_seeds().values() for n in onnx.load_from_string(data).graph.node}
    assert {(d, op) for d, op in RULES if d in ("", "cvm", "cvm.native")} <= covered


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_attributes_and_inputs_of_every_rule_are_refused_cleanly(data):
    check_mutant(data.draw(mutated_nodes(rule_seeds())))


# -- found by benchmarks/fuzz.py (onnx-rules, onnx-files) -------------------------------------------------------------
def test_run_model_of_a_model_without_inputs_is_a_runtime_error():
    """sessions.run_model read the first input's name of a model that has none (IndexError)."""
    from cvm_onnx.core.errors import RuntimeFailure
    from cvm_onnx.runtime import sessions

    m = int_model([helper.make_node("Constant", [], ["y"], name="n", value=helper.make_tensor("v", T.INT32, [1], [3]))])
    del m.graph.input[:]
    with pytest.raises(RuntimeFailure, match="the model has 0 inputs"):
        sessions.run_model(m, np.zeros((1, 4), np.int32))


def test_a_graph_output_named_empty_is_reported_with_a_place(tmp_path, capsys):
    """The problem of an undefined graph output named '' had an empty place, so its line named nothing."""
    m = int_model([node("Relu", ["data"])])
    m.graph.output.add().CopyFrom(helper.make_tensor_value_info("", T.INT32, [1, 4]))
    code, err = convert(tmp_path, m, capsys)
    assert (code, err) == (2, ["format error: graph output '': graph output is not defined by any node, input or "
                                "initializer"])


def test_run_of_strings_that_are_not_utf8_is_a_format_error(tmp_path, capsys):
    """onnxruntime's Python wrapper printed 'EP Error ... can't decode byte' on stdout and retried, before
    failing with an error of its own: run now checks the strings first, as the importer does."""
    data = int_model([helper.make_node("Relu", ["data"], ["y"], name="gvc")]).SerializeToString()
    (tmp_path / "m.onnx").write_bytes(data.replace(b"gvc", b"g\xffc"))
    code, err = run_cli(tmp_path, tmp_path / "m.onnx", capsys)
    assert (code, err) == (2, ["format error: model.graph.node[0].name: string is not UTF-8"])
    assert "EP Error" not in capsys.readouterr().out


def declared(value: str, tensor: str) -> onnx.ModelProto:
    """data + w, with metadata cvm.precision = ``value`` on ``tensor`` (w, or data:clamped for the input)."""
    m = int_model([node("Add", ["data", "w"])], inits=[numpy_helper.from_array(np.ones((1, 4), np.int32), "w")])
    vi = helper.make_tensor_value_info(tensor, T.INT32, [1, 4])
    vi.metadata_props.add(key="cvm.precision", value=value)
    m.graph.value_info.append(vi)
    return m


@pytest.mark.parametrize("value", ["-5", "0", "33", "abc", " 7"])
@pytest.mark.parametrize("tensor", ["w", "data:clamped"])
def test_a_declared_precision_outside_1_to_32_is_refused_by_convert(tmp_path, capsys, value, tensor):
    """A param's declared precision -5 or 0 made a negative shift (ValueError, exit 70); an input's 0 was taken
    as 'none declared' and the default used."""
    code, err = convert(tmp_path, declared(value, tensor), capsys)
    assert code in (3, 4) and len(err) == 1 and err[0].endswith((f"{value!r} is not a precision in [1, 32]",
                                                                 "variable precision 33 must lie in [1, 32]",
                                                                 "input precision 33 must lie in [1, 32]"))


@pytest.mark.parametrize("value", ["abc", "0"])
def test_info_of_a_model_with_a_bad_precision_or_element_type_says_so(tmp_path, capsys, value):
    """info took int() of the declared precision (ValueError, exit 70) and the name of element type 99 (ValueError)."""
    m = declared(value, "data:clamped")
    m.graph.output[0].type.tensor_type.elem_type = 99
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["info", str(tmp_path / "m.onnx")]) == 0
    out = capsys.readouterr().out
    assert f"input  data: int32 (1, 4), precision {value!r} (not a precision in [1, 32])" in out
    assert "output y: type 99 ()" in out


def test_a_cvm_node_calling_a_function_the_model_lacks_is_refused(tmp_path, capsys):
    """convert accepted a function-form node whose function was renamed away (found by fuzz.py: onnxruntime
    refused the model: 'cvm:strided_slice(-1) is not a registered function/op')."""
    ONNX_SEEDS = onnx_seeds()

    m = onnx.load_from_string(ONNX_SEEDS["cnn"])
    f = next(f for f in m.functions if f.name == "relu")
    f.name = "relu_gone"
    code, err = convert(tmp_path, m, capsys)
    assert code == FormatError.exit_code
    assert err and all(re.fullmatch(r"format error: relu_\d+: calls function cvm\.relu(\(\d+\))?, which the model "
                                    r"does not define", line) for line in err), err


@pytest.mark.parametrize("nodes, inits, line", [
    ([node("Conv", ["data", "w"])], [numpy_helper.from_array(np.ones((1, 1, 2, 2), np.int32), "w")],
     "unsupported: n (Conv): Conv: input 0 (X) is tensor(int32), not one of tensor(double), "
     "tensor(float), tensor(float16) (its schema's T)"),
    ([node("Add", ["data", "w"])], [numpy_helper.from_array(np.ones((1, 1, 4, 4), np.int64), "w")],
     "unsupported: n (Add): Add: input 1 (B) is tensor(int64), but an earlier input of type T is tensor(int32)"),
], ids=["Conv of int32", "Add of int32 and int64"])
def test_inputs_of_types_the_op_does_not_take_are_refused(tmp_path, capsys, nodes, inits, line):
    """convert accepted nodes whose input types break their schema's type constraints (onnxruntime refuses them:
    found by fuzz.py as 'convert: ok; run: RuntimeFailure')."""
    code, err = convert(tmp_path, int_model(nodes, (1, 1, 4, 4), inits=inits), capsys)
    assert (code, err) == (UnsupportedError.exit_code, [line])


def test_a_call_of_a_function_without_its_inputs_is_refused_not_a_segfault(tmp_path):
    """A function-form node renamed to a function of two inputs, called with one: onnxruntime loaded it and died
    of SIGSEGV running the body (found by fuzz.py: 'signal 11'); run and convert now refuse the call."""
    import subprocess
    import sys

    ONNX_SEEDS = onnx_seeds()

    m = onnx.load_from_string(ONNX_SEEDS["elementwise"])
    [n] = [n for n in m.graph.node if n.op_type == "negative"]
    n.op_type = "broadcast_max"
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 4), np.int32))
    for args in (["run", str(tmp_path / "m.onnx"), "--input", str(tmp_path / "x.npy"), "--output",
                  str(tmp_path / "o.npz")], ["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out")]):
        done = subprocess.run([sys.executable, "-m", "cvm_onnx.app.cli", *args], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == FormatError.exit_code, (args[0], done.returncode, done.stderr[-300:])
        assert done.stderr.splitlines() == [f"format error: {n.name}: calls function cvm.broadcast_max with inputs "
                                            "['data:clamped'] and 1 output(s); it takes 2 inputs, gives 1 output(s)"]


def test_run_of_a_node_missing_a_required_input_is_a_format_error(tmp_path):
    """A Max whose second input is '' (onnx-rules): convert refused it, but run handed it to onnxruntime, which
    loaded it and died of SIGSEGV running it. run now refuses it first, naming the node; in a child process, so
    that a crash fails this test instead of ending the run."""
    import subprocess
    import sys

    m = int_model([helper.make_node("Max", ["data", ""], ["y"], name="mx")])
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.array([[1, 2, 3, 4]], np.int32))
    done = subprocess.run([sys.executable, "-m", "cvm_onnx.app.cli", "run", str(tmp_path / "m.onnx"), "--input",
                           str(tmp_path / "x.npy"), "--output", str(tmp_path / "o.npz")],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.splitlines()) == (
        2, ["format error: mx: Max: input 1 (data_0) is required, but empty"])


def test_split_num_outputs_other_than_its_outputs_is_refused_at_once(tmp_path, capsys):
    """Split (opset 18) with num_outputs 2^40 for two outputs (onnx-rules) built a list of 2^40 sizes (a hang,
    then a blow-up); it is refused naming the node, whatever num_outputs."""
    for k in (1 << 40, 2**31, 3):
        m = int_model([helper.make_node("Split", ["data"], ["y", "z"], name="sp", axis=1, num_outputs=k)], opset=18)
        m.graph.output.add().CopyFrom(helper.make_tensor_value_info("z", T.INT32, None))
        code, err = convert(tmp_path, m, capsys)
        assert code == 4 and len(err) == 1 and err[0].startswith("unsupported: sp") and \
            f"num_outputs {k} for 2 outputs" in err[0], err


@pytest.mark.parametrize("batch_dims", [-1, -2, -3, -(1 << 31)])
def test_run_and_quantize_refuse_a_negative_gathernd_batch_dims_before_onnxruntime(tmp_path, batch_dims):
    """GatherND with batch_dims < 0 (onnx-rules: -2^31): convert refused it, but run handed it to onnxruntime,
    which died of SIGSEGV creating the session (-1 happened not to); quantize of a float model with one died the
    same way preparing it. Both refuse it first now, naming the node; in child processes, so that a crash fails this
    test instead of ending the run."""
    import subprocess
    import sys

    idx = numpy_helper.from_array(np.array([[[1]], [[0]]], np.int64), "idx")
    m = int_model([helper.make_node("GatherND", ["data", "idx"], ["y"], name="gnd", batch_dims=batch_dims)],
                  shape=(2, 2, 2), inits=[idx])
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.zeros((2, 2, 2), np.int32))
    want = f"gnd: GatherND: attribute batch_dims={batch_dims} must be >= 0"
    done = subprocess.run([sys.executable, "-m", "cvm_onnx.app.cli", "run", str(tmp_path / "m.onnx"), "--input",
                           str(tmp_path / "x.npy"), "--output", str(tmp_path / "o.npz")],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.splitlines()) == (2, [f"format error: {want}"])
    m.graph.input[0].type.tensor_type.elem_type = T.FLOAT
    m.graph.node.append(helper.make_node("MatMul", ["y", "w"], ["z"]))
    m.graph.initializer.append(numpy_helper.from_array(np.ones((2, 3), np.float32), "w"))
    m.graph.output[0].name, m.graph.output[0].type.tensor_type.elem_type = "z", T.FLOAT
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.ones((4, 2, 2, 2), np.float32))
    done = subprocess.run([sys.executable, "-m", "cvm_onnx.app.cli", "quantize", str(tmp_path / "f.onnx"),
                           "--calibration", str(tmp_path / "c.npy"), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr.splitlines()) == (2, [f"format error: {tmp_path / 'f.onnx'}: {want}"])


@pytest.mark.parametrize("op, shape, said", [
    ("ConstantOfShape", [-5], "a constant of shape (-5,): a dim is negative"),
    ("ConstantOfShape", [3, -1], "a constant of shape (3, -1): a dim is negative"),
    ("Tile", [1, -2], "a constant of shape (2, -6): a dim is negative")])
def test_a_constant_of_a_negative_dim_is_refused_naming_the_node(tmp_path, capsys, op, shape, said):
    """ConstantOfShape of a negative dim, Tile of a constant by a negative repeat: refused in one line naming the
    node. Regression: an internal error, numpy's 'negative dimensions are not allowed' (a hand check of huge and
    negative declared shapes: a negative product of dims passed the size bound)."""
    k = numpy_helper.from_array(np.array(shape, np.int64), "k")
    c = numpy_helper.from_array(np.arange(6, dtype=np.int32).reshape(2, 3), "c")
    nodes = [helper.make_node("ConstantOfShape", ["k"], ["f"], name="n", value=numpy_helper.from_array(
        np.array([1], np.int32))) if op == "ConstantOfShape" else helper.make_node("Tile", ["c", "k"], ["f"], name="n"),
             helper.make_node("Add", ["data", "f"], ["y"], name="add")]
    code, err = convert(tmp_path, int_model(nodes, shape=(2, 3), inits=[k, c]), capsys)
    assert code == 4 and len(err) == 1 and err[0].startswith(f"unsupported: n ({op})") and said in err[0], err
