"""The CVM file format layer: params binary, symbol JSON (three dialects in, cvm_1.0.0 out), model directories.

Oracles: a struct-based params encoder written from the byte layout of the notes (section 1.3), the exact text
and bytes quoted in the notes (sections 1.2 and 1.3), the runtime-written ResNet-20 files, and the runtime's
JSON rules restated in the tests (node_row_ptr as prefix sums, arg_nodes, storage ids).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import re
import struct
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cvm_onnx.core.errors import FormatError
from cvm_onnx.core.format import read_model, read_params, read_symbol, write_model, write_params, write_symbol
from cvm_onnx.core.format.symbol import layout
from cvm_onnx.core.graph import Entry, Graph, Node, TensorType

LIST_MAGIC = 0xF7E58D4F05049CB7
ARRAY_MAGIC = 0xDD5E40F096B4A13F
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)


def expect_error(fn, *fragments: str) -> FormatError:
    """``fn()`` raises FormatError whose message holds every fragment."""
    with pytest.raises(FormatError) as info:
        fn()
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
    return info.value


# -- params --------------------------------------------------------------------------------------------------------
def oracle_params(items: list[tuple[str, np.ndarray]]) -> bytes:
    """The params layout of the notes (1.3), element by element."""
    out = struct.pack("<QQQ", LIST_MAGIC, 0, len(items))
    for name, _ in items:
        raw = name.encode("utf-8")
        out += struct.pack("<Q", len(raw)) + raw
    out += struct.pack("<Q", len(items))
    for _, a in items:
        bits = a.dtype.itemsize * 8
        out += struct.pack("<QQiiiBBH", ARRAY_MAGIC, 0, 1, 0, a.ndim, 0, bits, 1)
        out += b"".join(struct.pack("<q", d) for d in a.shape) + struct.pack("<q", a.size * bits // 8)
        out += b"".join(struct.pack("<b" if bits == 8 else "<i", int(v)) for v in a.flat)
    return out


def int_arrays() -> st.SearchStrategy[np.ndarray]:
    shapes = hnp.array_shapes(min_dims=1, max_dims=6, min_side=1, max_side=3)
    return st.sampled_from([np.int8, np.int32]).flatmap(lambda t: hnp.arrays(t, shapes))


@FAST
@given(st.dictionaries(names, int_arrays(), max_size=4))
def test_params_bytes_match_the_layout_and_round_trip(params):
    data = write_params(params)
    assert data == oracle_params(list(params.items()))
    back = read_params(data)
    assert list(back) == list(params)
    for name, a in params.items():
        assert back[name].dtype == a.dtype and back[name].shape == a.shape and np.array_equal(back[name], a)
        assert back[name].flags.c_contiguous and back[name].flags.writeable
    assert write_params(back) == data


@FAST
@given(st.integers(1, 32), st.data())
def test_params_storage_type_follows_precision(p, data):
    bound = (1 << (p - 1)) - 1
    a = data.draw(hnp.arrays(np.int32, hnp.array_shapes(max_dims=3, max_side=4),
                             elements=st.sampled_from([0, 1, -1, bound, -bound]) | st.integers(-bound, bound)))
    stored = read_params(write_params({"w": a}, {"w": p}))["w"]
    assert stored.dtype == (np.int8 if p <= 8 else np.int32)
    assert np.array_equal(stored, a)
    # without a precision the array keeps its dtype
    assert read_params(write_params({"w": a}))["w"].dtype == np.int32


def test_params_write_rejects_what_cannot_be_stored():
    expect_error(lambda: write_params({"w": np.array([128], np.int32)}, {"w": 8}), "array 'w'", "int8")
    expect_error(lambda: write_params({"w": np.array([1], np.int64)}), "neither int8 nor int32")
    expect_error(lambda: write_params({"w": np.array([1.0])}, {"w": 8}), "not an integer type")
    expect_error(lambda: write_params({"w": np.array(3, np.int8)}), "ndim 0")
    expect_error(lambda: write_params({"w": np.zeros((2, 0), np.int8)}), "dimension")
    expect_error(lambda: write_params({"\ud800": np.zeros(1, np.int8)}), "UTF-8")
    assert read_params(write_params({})) == {}


def test_params_first_array_of_the_notes_example():
    """The bytes of the tiny model's conv_w (int8, (2, 1, 3, 3)) quoted in section 1.3."""
    w = np.arange(-9, 9, dtype=np.int8).reshape(2, 1, 3, 3)
    data = write_params({"conv_w": w, "conv_b": np.array([5, -7], np.int32)})
    assert data[:8] == bytes.fromhex("b79c04054f8de5f7")
    names_end = 24 + 8 + len("conv_w") + 8 + len("conv_b") + 8
    quoted = ("3fa1b496f0405edd 0000000000000000 01000000 00000000 04000000 00 08 0100 0200000000000000 "
              "0100000000000000 0300000000000000 0300000000000000 1200000000000000")
    header = bytes.fromhex(quoted.replace(" ", ""))
    assert data[names_end:names_end + len(header)] == header
    assert data[names_end + len(header):names_end + len(header) + 18] == w.tobytes()


SMALL = oracle_params([("w", np.arange(6, dtype=np.int8).reshape(2, 3))])
# Offsets in SMALL: 0 list magic, 16 name count, 24 name length, 32 "w", 33 array count, 41 array magic,
# 57 device type, 65 ndim, 69 code, 70 bits, 71 lanes, 73 and 81 shape, 89 byte size, 97 data (6 bytes).


def patched(*patches: tuple[int, str, int]) -> bytes:
    data = bytearray(SMALL)
    for offset, fmt, value in patches:
        struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize("data, fragments", [
    (patched((0, "<Q", 0x1234)), ["byte 0", "magic"]),
    (patched((16, "<Q", 1 << 62)), ["byte 16", "name count"]),
    (patched((24, "<Q", 1 << 62)), ["byte 32", "name 0", "truncated"]),
    (patched((32, "<B", 0xFF)), ["UTF-8"]),
    (patched((33, "<Q", 2)), ["byte 33", "2 arrays for 1 names"]),
    (patched((41, "<Q", 0)), ["byte 41", "array 'w'", "array magic"]),
    (patched((57, "<i", 2)), ["array 'w'", "device_type 2"]),
    (patched((65, "<i", 0)), ["array 'w'", "ndim 0"]),
    (patched((65, "<i", 7)), ["ndim 7"]),
    (patched((65, "<i", -1)), ["ndim -1"]),
    (patched((65, "<i", (1 << 31) - 1)), ["ndim 2147483647"]),
    (patched((69, "<B", 2)), ["array 'w'", "code 2"]),
    (patched((70, "<B", 16)), ["bits 16"]),
    (patched((71, "<H", 2)), ["lanes 2"]),
    (patched((73, "<q", 0)), ["byte 73", "array 'w'", "dimension"]),
    (patched((73, "<q", -5)), ["dimension"]),
    (patched((73, "<q", (1 << 24) + 1)), ["dimension"]),
    (patched((73, "<q", 1 << 62)), ["dimension"]),
    (patched((73, "<q", 1 << 24), (81, "<q", 1 << 24)), ["size exceeds 2^30"]),
    (patched((89, "<q", 7)), ["byte 89", "array 'w'", "byte size 7 != 6"]),
    (patched((89, "<q", 1 << 62)), ["byte size"]),
    (patched((73, "<q", 1 << 24), (81, "<q", 64), (89, "<q", 1 << 30)), ["byte 97", "needs 1073741824 bytes"]),
    (SMALL + b"\0", ["byte 103", "1 trailing bytes"]),
    (oracle_params([("w", np.zeros(1, np.int8)), ("w", np.zeros(1, np.int8))]), ["byte 33", "duplicate name 'w'"]),
])
def test_params_malformed(data, fragments):
    expect_error(lambda: read_params(data), *fragments)


def test_params_truncated_anywhere():
    data = oracle_params([("a", np.arange(4, dtype=np.int32)), ("bb", np.ones((1, 2), np.int8))])
    read_params(data)
    for n in range(len(data)):
        expect_error(lambda: read_params(data[:n]), "byte")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SMALL) - 1), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, len(SMALL)))
def test_params_corrupted_bytes_give_format_errors_only(flips, cut):
    data = bytearray(SMALL)
    for offset, value in flips:
        data[offset] = value
    for blob in (bytes(data), bytes(data[:cut])):
        try:
            out = read_params(blob)
        except FormatError:
            continue
        assert list(out) and all(a.dtype in (np.int8, np.int32) for a in out.values())


def test_resnet_params(onchain_resnet_dir):
    data = (onchain_resnet_dir / "params").read_bytes()
    params = read_params(data)
    assert len(params) == 108
    assert Counter(a.dtype for a in params.values()) == {np.dtype(np.int8): 34, np.dtype(np.int32): 74}
    assert write_params(params) == data  # byte-identical to the runtime-written file


# -- symbol: the tiny model of section 1.2 ---------------------------------------------------------------------------
def tiny_graph() -> Graph:
    """The tiny model of the notes (section 1.2), attributes in the order the quoted op_attrs show."""

    def var(name, shape):
        return Node(name, "null", outputs=(TensorType(shape, 8),))

    def op(name, op, inputs, attrs, shape, precision=-1):
        return Node(name, op, tuple(Entry(i) for i in inputs), attrs, (TensorType(shape, precision),))

    return Graph([
        var("data", (1, 1, 4, 4)), var("conv_w", (2, 1, 3, 3)), var("conv_b", (2,)),
        op("conv2d_0", "conv2d", [0, 1, 2], {"use_bias": True, "groups": 1, "dilation": (1, 1), "strides": (1, 1),
                                             "padding": (1, 1), "kernel_size": (3, 3), "channels": 2}, (1, 2, 4, 4)),
        op("cvm_right_shift_0", "cvm_right_shift", [3], {"shift_bit": 3, "precision": 8}, (1, 2, 4, 4), 8),
        op("max_pool2d_0", "max_pool2d", [4], {"padding": (0, 0), "strides": (2, 2), "pool_size": (2, 2)},
           (1, 2, 2, 2)),
        op("flatten_0", "flatten", [5], {}, (1, 8)),
        var("fc_w", (3, 8)),
        op("dense_0", "dense", [6, 7], {"use_bias": False, "units": 3}, (1, 3)),
        op("cvm_right_shift_1", "cvm_right_shift", [8], {"shift_bit": 7, "precision": 8}, (1, 3), 8),
    ], [Entry(9)])


# Verbatim from section 1.2 (the runtime's own output).
QUOTED = [
    '{\n  "nodes": [\n    {\n      "op": "null", \n      "name": "data", \n      "inputs": []\n    }, \n',
    '    {\n      "op": "cvm_op", \n      "name": "conv2d_0", \n      "attrs": {\n        "flatten_data": "0", \n'
    '        "func_name": "conv2d", \n        "num_inputs": "3", \n        "num_outputs": "1"\n      }, \n'
    '      "inputs": [[0, 0, 0], [1, 0, 0], [2, 0, 0]]\n    }, \n',
    '  ], \n  "arg_nodes": [0, 1, 2, 7], \n  "node_row_ptr": [\n    0, \n    1, \n',
    '    10\n  ], \n  "heads": [[9, 0, 0]], \n  "attrs": {\n    "op_attrs": ["list_str", [\n'
    '        "{\\"precision\\": \\"8\\", \\"shape\\": \\"(1, 1, 4, 4)\\"}", \n'
    '        "{\\"precision\\": \\"8\\", \\"shape\\": \\"(2, 1, 3, 3)\\"}", \n'
    '        "{\\"precision\\": \\"8\\", \\"shape\\": \\"(2,)\\"}", \n'
    '        "{\\"use_bias\\": \\"True\\", \\"groups\\": \\"1\\", \\"dilation\\": \\"(1, 1)\\", \\"strides\\": '
    '\\"(1, 1)\\", \\"padding\\": \\"(1, 1)\\", \\"kernel_size\\": \\"(3, 3)\\", \\"channels\\": \\"2\\"}", \n'
    '        "{\\"shift_bit\\": \\"3\\", \\"precision\\": \\"8\\"}", \n'
    '        "{\\"padding\\": \\"(0, 0)\\", \\"strides\\": \\"(2, 2)\\", \\"pool_size\\": \\"(2, 2)\\"}", \n'
    '        "{}", \n'
    '        "{\\"precision\\": \\"8\\", \\"shape\\": \\"(3, 8)\\"}", \n'
    '        "{\\"use_bias\\": \\"False\\", \\"units\\": \\"3\\"}", \n'
    '        "{\\"shift_bit\\": \\"7\\", \\"precision\\": \\"8\\"}"]], \n'
    '    "dltype": ["list_str", [\n        "int32", \n',
    '        "int32"]], \n    "precision": ["list_int", [8, 8, 8, -1, 8, -1, -1, 8, -1, 8]], \n',
    '    "shape": ["list_shape", [\n        [1, 1, 4, 4], \n        [2, 1, 3, 3], \n        [2], \n'
    '        [1, 2, 4, 4], \n        [1, 2, 4, 4], \n        [1, 2, 2, 2], \n        [1, 8], \n'
    '        [3, 8], \n        [1, 3], \n        [1, 3]]]\n  }, \n  "version": "cvm_1.0.0"\n}',
]


def test_tiny_example_is_written_as_the_runtime_writes_it():
    text = write_symbol(tiny_graph())
    for fragment in QUOTED:
        assert fragment in text, fragment
    assert text.startswith(QUOTED[0]) and text.endswith(QUOTED[-1])
    assert '"storage_id": ["list_int", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]], \n' in text
    assert text.count('"int32"') == 10


def test_tiny_example_reads_back():
    g = tiny_graph()
    back = read_symbol(write_symbol(g))
    assert [n.name for n in back.nodes] == [n.name for n in g.nodes]
    assert [n.op for n in back.nodes] == [n.op for n in g.nodes]
    assert [n.outputs for n in back.nodes] == [n.outputs for n in g.nodes]
    assert back.nodes[3].attrs == {"use_bias": "True", "groups": "1", "dilation": "(1, 1)", "strides": "(1, 1)",
                                   "padding": "(1, 1)", "kernel_size": "(3, 3)", "channels": "2"}
    assert back.nodes[0].attrs == {} and back.heads == [Entry(9, 0)] and back.params == {}


# -- symbol: ResNet-20 (2019 dialect) ----------------------------------------------------------------------------
def test_resnet_symbol(onchain_resnet_dir):
    text = (onchain_resnet_dir / "symbol").read_text()
    doc = json.loads(text)
    assert layout(doc) == text  # the writer's layout is the runtime's, byte for byte
    g = read_symbol(text)
    ops = [n for n in doc["nodes"] if n["op"] == "cvm_op"]
    assert len(g.nodes) == 333 and len(g.variables) == 109 and len(ops) == 224
    assert g.op_counts() == dict(Counter(re.sub(r"_\d+$", "", n["attrs"]["func_name"]) for n in ops))
    assert set(g.op_counts()) == {"conv2d", "cvm_right_shift", "cvm_clip", "broadcast_mul", "relu", "elemwise_add",
                                  "sum", "flatten", "dense"}
    assert g.heads == [Entry(332, 0)]
    shapes, precisions = doc["attrs"]["shape"][1], doc["attrs"]["precision"][1]
    for i, (node, raw) in enumerate(zip(g.nodes, doc["nodes"])):
        assert node.name == raw["name"] and [[e.node, e.index] for e in node.inputs] == [x[:2] for x in raw["inputs"]]
        assert node.outputs == (TensorType(tuple(shapes[i]), precisions[i]),)  # one output per node here
        if not node.is_variable:
            assert node.attrs == json.loads(doc["attrs"]["op_attrs"][1][i])
    assert g.nodes[3].attrs["kernel_size"] == "[1, 1]"


def test_resnet_written_and_read_back(onchain_resnet_dir):
    g = read_symbol((onchain_resnet_dir / "symbol").read_bytes())
    text = write_symbol(g)
    back = read_symbol(text)
    assert back.nodes == g.nodes and back.heads == g.heads
    assert write_symbol(back) == text
    doc = json.loads(text)
    assert doc["version"] == "cvm_1.0.0" and doc["attrs"]["storage_id"][1] == list(range(333))


# -- symbol: random graphs ------------------------------------------------------------------------------------------
op_names = st.sampled_from(["conv2d", "cvm_right_shift", "get_valid_counts", "sum"]) | \
    st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
shapes = st.lists(st.integers(1, 9), min_size=1, max_size=6).map(tuple)
precisions = st.sampled_from([-1]) | st.integers(1, 32)


@st.composite
def graphs(draw) -> Graph:
    n_vars, n_ops = draw(st.integers(1, 3)), draw(st.integers(0, 4))
    labels = draw(st.lists(names, min_size=n_vars + n_ops, max_size=n_vars + n_ops, unique=True))
    nodes, entries = [], []
    for i in range(n_vars):
        nodes.append(Node(labels[i], "null", outputs=(TensorType(draw(shapes), draw(st.integers(1, 32))),)))
        entries.append(Entry(i))
    for i in range(n_vars, n_vars + n_ops):
        inputs = tuple(draw(st.lists(st.sampled_from(entries), min_size=1, max_size=3)))
        attrs = draw(st.dictionaries(names, names, max_size=3))
        outputs = tuple(TensorType(draw(shapes), draw(precisions)) for _ in range(draw(st.integers(1, 2))))
        nodes.append(Node(labels[i], draw(op_names), inputs, attrs, outputs))
        entries += [Entry(i, k) for k in range(len(outputs))]
    heads = draw(st.lists(st.sampled_from(entries), min_size=1, max_size=2))
    return Graph(nodes, heads, postprocess=draw(st.none() | st.sampled_from(["argmax", "detection"])))


@FAST
@given(graphs())
def test_random_graphs_round_trip(g):
    text = write_symbol(g)
    back = read_symbol(text)
    assert back.nodes == g.nodes and back.heads == g.heads and back.postprocess == g.postprocess
    assert write_symbol(back) == text
    doc = json.loads(text, strict=False)  # the runtime's cvm_1.0.0 rules, restated
    counts = [len(n.outputs) for n in g.nodes]
    assert doc["node_row_ptr"] == [sum(counts[:i]) for i in range(len(counts) + 1)]
    assert doc["arg_nodes"] == [i for i, n in enumerate(g.nodes) if n.op == "null"]
    assert doc["attrs"]["storage_id"] == ["list_int", list(range(sum(counts)))]
    assert doc["attrs"]["dltype"] == ["list_str", ["int32"] * sum(counts)]
    assert doc["heads"] == [[e.node, e.index, 0] for e in g.heads]
    assert doc["version"] == "cvm_1.0.0"


def test_typed_attributes_are_written_in_mrt_syntax():
    g = tiny_graph()
    g.nodes[6] = Node("flatten_0", "flatten", (Entry(5),),
                      {"a": True, "b": (1, 2), "c": (5,), "d": None, "e": -3, "f": "(1, 1)", "g": "x\"y"},
                      (TensorType((1, 8)),))
    doc = json.loads(write_symbol(g))
    assert doc["attrs"]["op_attrs"][1][6] == \
        '{"a": "True", "b": "(1, 2)", "c": "(5,)", "d": "None", "e": "-3", "f": "(1, 1)", "g": "x\\"y"}'


def test_writer_refuses_graphs_the_runtime_refuses():
    g = tiny_graph()
    g.nodes[0] = Node("data", "null", outputs=(TensorType((1, 1, 4, 4), -1),))
    expect_error(lambda: write_symbol(g), "node 0 'data'", "a variable needs a precision")
    g = tiny_graph()
    g.nodes[4] = Node("x", "relu", (Entry(5),), {}, (TensorType((1, 2, 4, 4)),))
    expect_error(lambda: write_symbol(g), "topological order")
    g = tiny_graph()
    g.nodes[6] = Node("flatten_0", "flatten", (Entry(5),), {}, ())
    expect_error(lambda: write_symbol(g), "has no output types")


# -- symbol: dialects --------------------------------------------------------------------------------------------------
def doc_of(g: Graph) -> dict:
    return json.loads(write_symbol(g), strict=False)


def test_2019_dialect():
    doc = doc_of(tiny_graph())
    del doc["version"]
    doc["attrs"]["dtype"] = ["list_int", [4] * 10]
    for i, node in enumerate(doc["nodes"]):
        if node["op"] == "cvm_op":
            node["attrs"]["op_attrs"] = ""
            node["attrs"]["func_name"] += f"_{i}"
        else:
            doc["attrs"]["op_attrs"][1][i] = ""
    g = read_symbol(json.dumps(doc))
    assert [n.op for n in g.nodes] == [n.op for n in tiny_graph().nodes]
    assert g.nodes[4].attrs == {"shift_bit": "3", "precision": "8"}


@pytest.mark.parametrize("func_name, op", [("cvm_right_shift_11", "cvm_right_shift"), ("conv2d", "conv2d"),
                                           ("max_pool2d", "max_pool2d"), ("flatten_", "flatten"),
                                           ("broadcast_mul_0", "broadcast_mul")])
def test_func_name_suffix_is_stripped_like_the_runtime(func_name, op):
    doc = doc_of(tiny_graph())
    doc["nodes"][6]["attrs"]["func_name"] = func_name
    assert read_symbol(json.dumps(doc)).nodes[6].op == op


def nms_doc(**top) -> dict:
    """A cvm_1.1.0 graph with a two-output node whose outputs are used as [1] then [0] (MRT's NMS wiring)."""
    doc = {
        "nodes": [{"op": "null", "name": "data", "inputs": []},
                  {"op": "cvm_op", "name": "gvc", "attrs": {"func_name": "get_valid_counts"}, "inputs": [[0, 0]]},
                  {"op": "cvm_op", "name": "nms", "attrs": {"func_name": "non_max_suppression"},
                   "inputs": [[1, 1], [1, 0]]}],
        "heads": [[2, 0, 0]],
        "attrs": {"shape": ["list_shape", [[1, 5, 6], [1], [1, 5, 6], [1, 5, 6]]],
                  "storage_id": ["list_int", [0, 1, 2, 3]], "precision": ["list_int", [8, -1, -1, -1]],
                  "op_attrs": ["list_str", ["", "{}", "{\"iou_threshold\": \"50\"}"]]},
        "version": "cvm_1.1.0",
    }
    doc.update(top)
    return doc


def test_cvm_1_1_0_output_counts_inferred_from_references():
    g = read_symbol(json.dumps(nms_doc()))
    assert [len(n.outputs) for n in g.nodes] == [1, 2, 1]
    assert g.nodes[2].inputs == (Entry(1, 1), Entry(1, 0))
    assert g.nodes[1].outputs == (TensorType((1,), -1), TensorType((1, 5, 6), -1))
    # a usable node_row_ptr wins; a wrong one is ignored in cvm_1.1.0 (the runtime recomputes it)
    assert len(read_symbol(json.dumps(nms_doc(node_row_ptr=[0, 1, 3, 4]))).nodes[1].outputs) == 2
    assert len(read_symbol(json.dumps(nms_doc(node_row_ptr=[7]))).nodes[1].outputs) == 2
    back = read_symbol(write_symbol(g))
    assert back.nodes == g.nodes
    unused = nms_doc(heads=[[1, 0, 0]])
    unused["nodes"].pop()
    unused["attrs"]["op_attrs"][1].pop()
    expect_error(lambda: read_symbol(json.dumps(unused)), "attrs.shape", "has 4 elements, expected 2")


# -- symbol: malformed ---------------------------------------------------------------------------------------------
def mutate(path: str, value=None, delete=False):
    """A function setting (or deleting) doc[path], path like "nodes.3.attrs.func_name"."""

    def apply(doc):
        *parents, last = [int(k) if k.lstrip("-").isdigit() else k for k in path.split(".")]
        for key in parents:
            doc = doc[key]
        if delete:
            del doc[last]
        else:
            doc[last] = copy.deepcopy(value)

    return apply


MALFORMED = [
    (mutate("extra", 1), "unknown top-level key 'extra'"),
    (mutate("nodes", delete=True), "required key 'nodes' is missing"),
    (mutate("heads", delete=True), "required key 'heads' is missing"),
    (mutate("attrs", delete=True), "required key 'attrs' is missing"),
    (mutate("nodes", {}), "nodes: must be an array"),
    (mutate("version", "cvm_2.0.0"), "'cvm_2.0.0' is not one of"),
    (mutate("version", 1), "1 is not one of"),
    (mutate("postprocess", 5), "postprocess: must be a string"),
    (mutate("nodes.0.control_deps", []), "unknown node key 'control_deps'"),
    (mutate("nodes.0", "data"), "node 0: a node must be a JSON object"),
    (mutate("nodes.3.op", "conv2d"), "op must be \"null\" or \"cvm_op\""),
    (mutate("nodes.3.op", delete=True), "required key 'op' is missing"),
    (mutate("nodes.3.name", 5), "node 3: name must be a string"),
    (mutate("nodes.3.name", delete=True), "node 3: required key 'name' is missing"),
    (mutate("nodes.3.inputs", delete=True), "required key 'inputs' is missing"),
    (mutate("nodes.3.inputs", {}), "inputs must be an array"),
    (mutate("nodes.3.precision", "8"), "precision must be an integer"),
    (mutate("nodes.3.attrs.layout", "NCHW"), "unknown node attribute key 'layout'"),
    (mutate("nodes.3.attrs.num_inputs", 3), "attrs.num_inputs must be a string"),
    (mutate("nodes.3.attrs.func_name", delete=True), "attrs.func_name is required"),
    (mutate("nodes.3.attrs.func_name", "_12"), "names no op"),
    (mutate("nodes.3.attrs", delete=True), "an op node needs attrs with func_name"),
    (mutate("nodes.3.attrs", []), "attrs must be an object"),
    (mutate("nodes.3.inputs.0", [0]), "inputs[0]: an entry must be"),
    (mutate("nodes.3.inputs.0", "x"), "an entry must be"),
    (mutate("nodes.3.inputs.0", [0, -1, 0]), "an entry must be"),
    (mutate("nodes.3.inputs.0", [0, 0, 0, 0]), "an entry must be"),
    (mutate("nodes.3.inputs.0", [True, 0]), "an entry must be"),
    (mutate("nodes.3.inputs.0", [0.0, 0]), "an entry must be"),
    (mutate("nodes.3.inputs.0", [42, 0, 0]), "refers to node 42, which does not exist"),
    (mutate("nodes.3.inputs.0", [5, 0, 0]), "topological order"),
    (mutate("nodes.3.inputs.0", [3, 0, 0]), "topological order"),
    (mutate("nodes.3.inputs.0", [0, 1, 0]), "refers to output 1 of node 0, which has 1 output(s)"),
    (mutate("heads.0", [10, 0, 0]), "heads[0]: refers to node 10"),
    (mutate("heads", "x"), "heads: must be an array"),
    (mutate("nodes.7.name", "conv_w"), "variable name 'conv_w' is used twice"),
    (mutate("nodes.1.inputs", [[0, 0, 0]]), "a variable (op \"null\") must have no inputs"),
    (mutate("attrs.foo", ["list_int", []]), "unknown graph attribute 'foo'"),
    (mutate("attrs", []), "attrs: must be an object"),
    (mutate("attrs.shape.0", "list_int"), "attrs.shape: must be [\"list_shape\""),
    (mutate("attrs.precision", [8]), "attrs.precision: must be [\"list_int\""),
    (mutate("attrs.shape", delete=True), "graph attribute 'shape' is required"),
    (mutate("attrs.storage_id", delete=True), "graph attribute 'storage_id' is required"),
    (mutate("attrs.op_attrs", delete=True), "graph attribute 'op_attrs' is required"),
    (mutate("attrs.precision", delete=True), "graph attribute 'precision' is required"),
    (mutate("attrs.dltype", delete=True), "graph attribute 'dltype' is required in cvm_1.0.0"),
    (mutate("attrs.precision.1", [8] * 9), "attrs.precision: has 9 elements, expected 10"),
    (mutate("attrs.op_attrs.1", ["{}"] * 11), "attrs.op_attrs: has 11 elements, expected 10 (one per node)"),
    (mutate("attrs.shape.1.0", []), "attrs.shape[0] (node 0 'data' output 0): ndim 0"),
    (mutate("attrs.shape.1.0", [1, 1, 1, 1, 1, 1, 1]), "ndim 7"),
    (mutate("attrs.shape.1.0", [0]), "every dimension must lie in (0, 2^24]"),
    (mutate("attrs.shape.1.0", [(1 << 24) + 1]), "every dimension must lie in (0, 2^24]"),
    (mutate("attrs.shape.1.0", [1 << 15, 1 << 15, 2]), "size exceeds 2^30"),
    (mutate("attrs.shape.1.0", [1.5]), "attrs.shape: element 0 must be an array of integers"),
    (mutate("attrs.shape.1", {}), "attrs.shape: the value must be an array"),
    (mutate("attrs.precision.1.3", 33), "attrs.precision[3] (node 3 'conv2d_0' output 0): precision 33"),
    (mutate("attrs.precision.1.3", 0), "precision 0 must be -1 or in [1, 32]"),
    (mutate("attrs.precision.1.1", -1), "attrs.precision[1] (node 1 'conv_w' output 0): a variable needs"),
    (mutate("attrs.precision.1.1", "8"), "attrs.precision: element 1 must be an integer"),
    (mutate("attrs.precision.1.1", 1 << 40), "attrs.precision: element 1 must be an integer"),
    (mutate("attrs.dltype.1.2", "float32"), "attrs.dltype[2] (node 2 'conv_b' output 0): dltype 'float32'"),
    (mutate("attrs.storage_id.1.0", -1), "attrs.storage_id[0]: storage id -1 is negative"),
    (mutate("attrs.storage_id.1.3", 0), "node 3 'conv2d_0': output 0 reuses the storage id 0"),
    (mutate("attrs.device_index", ["list_int", [0]]), "attrs.device_index: must be absent or empty"),
    (mutate("attrs.dtype", ["list_float", []]), "legacy dtype"),
    (mutate("node_row_ptr", delete=True), "node_row_ptr: is required in cvm_1.0.0"),
    (mutate("node_row_ptr", [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), "gives node 0 2 outputs"),
    (mutate("node_row_ptr", [0, 1, 2]), "must have 11 elements"),
    (mutate("node_row_ptr", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, "10"]), "must be an array of unsigned integers"),
    (mutate("arg_nodes", [0, 1, 2]), "arg_nodes: must list the 4 variables' node indices"),
    (mutate("arg_nodes", delete=True), "arg_nodes: must list"),
    (mutate("attrs.op_attrs.1.3", "{bad"), "attrs.op_attrs[3] (node 3 'conv2d_0'): malformed JSON"),
    (mutate("attrs.op_attrs.1.3", ""), "attrs.op_attrs[3] (node 3 'conv2d_0'): malformed JSON"),
    (mutate("attrs.op_attrs.1.3", "[\"a\"]"), "must be a JSON object of strings"),
    (mutate("attrs.op_attrs.1.3", "{\"a\": 1}"), "attribute values must be strings: a"),
    (mutate("attrs.op_attrs.1.3", "{\"a\": \"\\u0041\"}"), "string escape \\u is not read by the runtime"),
    (mutate("attrs.op_attrs.1.3", 3), "attrs.op_attrs: element 3 must be a string"),
]


@pytest.mark.parametrize("change, fragment", MALFORMED, ids=[m[1][:40] for m in MALFORMED])
def test_symbol_malformed(change, fragment):
    doc = doc_of(tiny_graph())
    change(doc)
    err = expect_error(lambda: read_symbol(json.dumps(doc)), fragment)
    assert all(str(p).startswith("symbol") for p in err.problems)


def test_symbol_rules_that_allow():
    """What the runtime accepts: 2-element entries, in-place storage for in-place ops, empty device_index."""
    doc = doc_of(tiny_graph())
    doc["nodes"][3]["inputs"][0] = [0, 0]
    doc["attrs"]["storage_id"][1][4] = 3  # cvm_right_shift may run in place
    doc["attrs"]["device_index"] = ["list_int", []]
    doc["nodes"][3]["precision"] = 8
    doc["attrs"]["op_attrs"][1][0] = "not JSON: variables' strings are ignored"
    doc["attrs"]["op_attrs"][1][6] = '{"a": "\\"\\\\\\n\\t\\r"}'
    assert read_symbol(json.dumps(doc)).nodes[6].attrs == {"a": "\"\\\n\t\r"}


def test_many_problems_are_reported_at_once():
    doc = doc_of(tiny_graph())
    fragments = ["unknown top-level key 'extra'", "unknown node attribute key 'layout'",
                 "variable name 'conv_w' is used twice",
                 "attrs.precision[1] (node 1 'conv_w' output 0): a variable needs"]
    changes = {fragment: change for change, fragment in MALFORMED}
    for fragment in fragments:
        changes[fragment](doc)
    err = expect_error(lambda: read_symbol(json.dumps(doc)), *fragments)
    assert len(err.problems) == 4


@pytest.mark.parametrize("text, fragments", [
    ("{", ["symbol, line 1 column 2", "malformed JSON"]),
    ('{\n  "nodes": [\n    {,\n', ["line 3 column 6", "malformed JSON"]),
    ("", ["line 1 column 1"]),
    ('{"nodes": [], "heads": NaN, "attrs": {}}', ["NaN is not JSON"]),
    ("[" * 100000, ["malformed JSON"]),
    (b'{"nodes": "\xff"}', ["symbol, byte 11", "not UTF-8"]),
    ('{"nodes": [], "heads": [], "attrs": {}, "version": "cvm_1.\\u0030.0"}', ["line 1 column 59", "escape \\u"]),
    ('{"nodes": [], "heads": [], "attrs": {}, "version": "cvm_1.0.0\\/"}', ["escape \\/"]),
    ("[]", ["the symbol must be a JSON object"]),
    ("3", ["the symbol must be a JSON object"]),
])
def test_symbol_bad_json(text, fragments):
    expect_error(lambda: read_symbol(text), *fragments)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 12) | st.sampled_from([1 << 40, 0.5, "", "{}"])
                           | st.text(max_size=4), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)


def paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


TINY_DOC = doc_of(tiny_graph())
TINY_PATHS = list(paths(TINY_DOC))[1:]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(TINY_PATHS), json_values | st.just(KeyError)), min_size=1, max_size=3))
def test_symbol_fuzzed_structure_gives_format_errors_only(changes):
    doc = copy.deepcopy(TINY_DOC)
    for path, value in changes:
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            if value is KeyError:
                del target[path[-1]]
            else:
                target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed this path
    try:
        read_symbol(json.dumps(doc))
    except FormatError as e:
        assert e.problems and all(str(p).startswith("symbol") for p in e.problems)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(write_symbol(tiny_graph())) - 1), st.text(max_size=3))
def test_symbol_fuzzed_text_gives_format_errors_only(pos, insert):
    text = write_symbol(tiny_graph())
    try:
        read_symbol(text[:pos] + insert + text[pos + 1:])
    except FormatError:
        pass


# -- model directories ------------------------------------------------------------------------------------------------
def tiny_model() -> Graph:
    g = tiny_graph()
    rng = np.random.default_rng(0)
    g.params = {"conv_w": rng.integers(-127, 128, (2, 1, 3, 3)).astype(np.int32),
                "conv_b": np.array([100, -100], np.int8),
                "fc_w": rng.integers(-127, 128, (3, 8)).astype(np.int8)}
    return g


def test_model_directory_round_trip(tmp_path):
    g = tiny_model()
    write_model(g, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["params", "symbol"]  # no temporary left
    back = read_model(tmp_path / "m")
    assert back.nodes == read_symbol(write_symbol(g)).nodes
    assert list(back.params) == list(g.params)
    for name, a in g.params.items():
        assert back.params[name].dtype == np.int8  # every variable has precision 8
        assert np.array_equal(back.params[name], a)
    explicit = read_model(tmp_path / "m" / "symbol", tmp_path / "m" / "params")
    assert explicit.nodes == back.nodes
    g.params["fc_w"] = np.zeros((3, 8), np.int8)
    write_model(g, tmp_path / "m")  # replaces both files
    assert not read_model(tmp_path / "m").params["fc_w"].any()


def test_model_directory_errors(tmp_path):
    expect_error(lambda: read_model(tmp_path / "none"), "no such model directory or file")
    err = expect_error(lambda: read_model(tmp_path), "symbol: no such file", "params: no such file")
    assert len(err.problems) == 2
    write_model(tiny_model(), tmp_path)
    expect_error(lambda: read_model(tmp_path / "symbol"), "or a symbol file with --params")
    expect_error(lambda: read_model(tmp_path, tmp_path), "is a directory")
    (tmp_path / "params").write_bytes(b"\0" * 10)
    expect_error(lambda: read_model(tmp_path), "params, byte 0", "needs 16 bytes")
    (tmp_path / "file").write_text("x")
    expect_error(lambda: write_model(tiny_model(), tmp_path / "file"), "cannot write the model")


def test_a_param_that_cannot_be_stored_leaves_no_model_written(tmp_path):
    """write_model writes the params as each array's bytes are made: a param that fails late (its value outside
    its storage type, after others were written) leaves the old files as they were, no temporary, and no new
    directory."""
    g = tiny_model()
    g.params["fc_w"] = np.full((3, 8), 1000, np.int32)  # precision 8: int8 cannot hold it
    expect_error(lambda: write_model(g, tmp_path / "new"), "array 'fc_w'", "int8")
    assert not (tmp_path / "new").exists()
    write_model(tiny_model(), tmp_path / "old")
    before = {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()}
    expect_error(lambda: write_model(g, tmp_path / "old"), "array 'fc_w'", "int8")
    assert {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()} == before
    assert (tmp_path / "old" / "params").read_bytes() == write_params(
        tiny_model().params, {name: 8 for name in tiny_model().params})


@pytest.mark.parametrize("fill", [0, 7])
def test_params_holding_the_input_are_refused_by_load_and_run(tmp_path, capsys, fill):
    """A params file that also holds 'data' (the input): the real runtime loads it and runs the given input in its
    place; load and run refuse it in one line naming 'data'. Regression: the model had no input, the reference
    executor computed on the param, whatever the input (a wrong result), and run failed with an internal error
    (IndexError: a params file checked by hand against the symbol)."""
    import cvm_onnx
    from cvm_onnx.app.cli import main
    from cvm_onnx.core.errors import ValidationError

    g = tiny_model()
    write_model(g, tmp_path / "m")
    [i] = g.inputs
    shape = g.nodes[i].outputs[0].shape
    params = read_params((tmp_path / "m" / "params").read_bytes())
    (tmp_path / "m" / "params").write_bytes(write_params({**params, "data": np.full(shape, fill, np.int32)}))
    with pytest.raises(ValidationError, match="params hold a value of the input 'data'"):
        cvm_onnx.load(tmp_path / "m")
    np.save(tmp_path / "x.npy", np.ones(shape, np.int32))
    code = main(["run", str(tmp_path / "m"), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "o.npy")])
    err = capsys.readouterr().err.splitlines()
    assert code not in (0, 70) and len(err) == 1 and "params hold a value of the input 'data'" in err[0], (code, err)


def test_a_model_without_its_input_is_refused_by_load_and_run(tmp_path, capsys):
    """A symbol whose input is renamed and given a param (every variable then a param): the real runtime refuses to
    load it ('can not find input `data`'); load and run refuse it in one line naming 'data'. Regression: it loaded
    as a model of no input, and run failed with an internal error (IndexError)."""
    import cvm_onnx
    from cvm_onnx.app.cli import main
    from cvm_onnx.core.errors import ValidationError

    g = tiny_model()
    [i] = g.inputs
    shape = g.nodes[i].outputs[0].shape
    g.nodes[i] = dataclasses.replace(g.nodes[i], name="x")
    g.params["x"] = np.zeros(shape, np.int32)
    write_model(g, tmp_path / "m")
    with pytest.raises(ValidationError, match="the graph has no variable 'data'"):
        cvm_onnx.load(tmp_path / "m")
    np.save(tmp_path / "x.npy", np.ones(shape, np.int32))
    code = main(["run", str(tmp_path / "m"), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "o.npy")])
    err = capsys.readouterr().err.splitlines()
    assert code not in (0, 70) and len(err) == 1 and "the graph has no variable 'data'" in err[0], (code, err)


def test_resnet_model_directory(onchain_resnet_dir, tmp_path):
    g = read_model(onchain_resnet_dir)
    assert len(g.params) == 108 and [g.nodes[i].name for i in g.inputs] == ["data"]
    write_model(g, tmp_path)
    assert (tmp_path / "params").read_bytes() == (onchain_resnet_dir / "params").read_bytes()
    back = read_model(tmp_path)
    assert back.nodes == g.nodes and back.heads == g.heads
    assert all(np.array_equal(back.params[k], v) and back.params[k].dtype == v.dtype for k, v in g.params.items())
