"""The importer on the exporter's own models: CVM -> ONNX -> CVM is the identity (same nodes, bound attributes,
names, shapes, precisions, heads, params byte for byte), for the function form and the flat form, on random
graphs over every op family, on the example models and on ResNet-20, in memory and through the files."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import tensors

import cvm_onnx
from cvm_onnx.app.cli import main
from cvm_onnx.converters.from_onnx import from_onnx
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.format import pack_symbol, read_model, unpack_symbol, write_model
from cvm_onnx.core.format.params import write_params
from cvm_onnx.core.ops import REGISTRY, OpRuleError
from cvm_onnx.core.validate import shape_problem, validate

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


def describe(g) -> tuple:
    """Everything the round trip keeps, independent of node order: per node name its op, bound attributes,
    inputs by (name, output) and output types; the heads by name; each param's dtype, shape and bytes."""
    names = [n.name for n in g.nodes]
    nodes = {n.name: (n.op, None if n.is_variable else REGISTRY[n.op].bind(n.attrs),
                      tuple((names[e.node], e.index) for e in n.inputs), n.outputs) for n in g.nodes}
    params = {k: (v.dtype, v.shape, v.tobytes()) for k, v in g.params.items()}
    return nodes, [(names[h.node], h.index) for h in g.heads], params


def assert_same(original, imported) -> None:
    a, b = describe(original), describe(imported)
    assert a[0].keys() == b[0].keys()
    for name in a[0]:
        assert a[0][name] == b[0][name], name
    assert a[1:] == b[1:]


def through_files(graph):
    with tempfile.TemporaryDirectory() as d:
        write_model(graph, d)
        return validate(read_model(d)).graph


# -- random graphs over every op family -----------------------------------------------------------------------
class Graphs:
    """Builds a random valid graph: ops with random attributes over the live values, kept when the registry's
    rules accept them (shape, precision <= 32), requantized when a value grows past 24 bits."""

    def __init__(self, draw):
        self.draw = draw
        self.b = GraphBuilder()
        self.live: list[tuple] = []  # (entry, shape, precision)
        self.k = 0

    def param(self, shape, p):
        self.k += 1
        return self.b.param(f"w{self.k}", self.draw(tensors(shape, p)), p), tuple(shape), p

    def add(self, op, *ins, **attrs):
        cls = REGISTRY[op]
        typed, errors = cls.parse_attrs(attrs)
        if errors:
            return None
        a = cls.bind(typed)
        lo, hi = cls.arity(a)
        shapes = [v[1] for v in ins]
        try:
            assert lo <= len(ins) <= hi
            out_shapes = cls.infer_shapes(a, shapes)
            precs = cls.infer_precisions(a, [v[2] for v in ins], shapes)
        except (OpRuleError, AssertionError):
            return None
        if any(shape_problem(s) for s in out_shapes) or max(precs) > 32:
            return None
        self.k += 1
        out = self.b.op(op, *[v[0] for v in ins], name=f"{op}_{self.k}", **attrs)
        outs = [(e, s, p) for e, s, p in zip(out if isinstance(out, tuple) else (out,), out_shapes, precs)]
        self.live += outs
        return outs[0]

    def pick(self):
        return self.live[self.draw(st.integers(0, len(self.live) - 1))]

    def same_shape(self, s):
        same = [v for v in self.live if v[1] == s]
        return same[self.draw(st.integers(0, len(same) - 1))]

    def step(self):
        d = self.draw
        x = self.pick()
        e, s, p = x
        if p > 24:
            self.add("cvm_right_shift", x, precision=d(st.integers(1, 16)), shift_bit=d(st.integers(1, 8)))
            return
        n = len(s)
        axis = d(st.integers(-n, n - 1))
        op = d(st.sampled_from(sorted(REGISTRY)))
        if op in ("relu", "abs", "negative", "cvm_precision", "flatten", "squeeze"):
            self.add(op, x)
        elif op == "cvm_clip":
            self.add(op, x, precision=d(st.integers(1, 32)))
        elif op in ("cvm_right_shift", "cvm_left_shift"):
            self.add(op, x, precision=d(st.integers(1, 16)), shift_bit=d(st.integers(1, 8)))
        elif op == "clip":
            lo = d(st.integers(-200, 100))
            self.add(op, x, a_min=lo, a_max=lo + d(st.integers(1, 300)))
        elif op in ("elemwise_add", "elemwise_sub"):
            self.add(op, x, self.same_shape(s))
        elif op.startswith("broadcast_"):
            shape = tuple(1 if d(st.booleans()) else k for k in s)[d(st.integers(0, n - 1)):]
            y = self.param(shape, d(st.integers(1, 8))) if d(st.booleans()) else self.pick()
            self.add(op, *((x, y) if d(st.booleans()) else (y, x)))
        elif op in ("sum", "max"):
            axes = tuple(d(st.lists(st.integers(-n, n - 1), max_size=n, unique=True)))
            self.add(op, x, axis=axes, keepdims=d(st.booleans()), exclude=d(st.booleans()))
        elif op == "reshape":
            self.add(op, x, shape=d(st.sampled_from([(-1,), (1, -1), (0, -1), (-2, 1)])))
        elif op == "expand_dims":
            self.add(op, x, axis=d(st.integers(-n - 1, n)), num_newaxis=d(st.integers(1, 2)))
        elif op == "transpose":
            self.add(op, x, axes=tuple(d(st.permutations(range(n)))) if d(st.booleans()) else ())
        elif op == "strided_slice":
            begin, end, stride = [], [], []
            for k in s[:d(st.integers(1, n))]:
                st_ = d(st.sampled_from([-2, -1, 1, 2]))
                b_ = d(st.integers(0, k - 1))
                e_ = d(st.integers(b_ + 1, k)) if st_ > 0 else d(st.integers(-1, b_ - 1))
                begin.append(b_ - k if d(st.booleans()) else b_)
                end.append(-k - 1 if e_ == -1 else e_ - k if d(st.booleans()) else e_)
                stride.append(st_)
            self.add(op, x, begin=tuple(begin), end=tuple(end), stride=tuple(stride))
        elif op == "repeat":
            self.add(op, x, repeats=d(st.integers(1, 3)), axis=axis)
        elif op == "tile":
            self.add(op, x, reps=tuple(d(st.lists(st.integers(1, 2), min_size=1, max_size=3))))
        elif op == "take":
            idx = self.param(d(st.sampled_from([(2,), (1, 3)])), 4)
            self.add(op, x, idx, **({"axis": axis} if d(st.booleans()) else {}))
        elif op == "cvm_lut":
            table = self.param((d(st.integers(1, 8)),), 8)
            self.add(op, x, table, in_dim=table[1][0])
        elif op == "concatenate":
            same = [v for v in self.live if len(v[1]) == n]
            self.add(op, *[same[d(st.integers(0, len(same) - 1))] for _ in range(d(st.integers(1, 3)))], axis=axis)
        elif op == "where":
            cond = self.add("broadcast_greater", x, self.param((1,), 4))
            self.add(op, cond, x, self.same_shape(s))
        elif op == "slice_like":
            self.add(op, x, self.pick(), axis=tuple(d(st.lists(st.integers(0, n - 1), max_size=n, unique=True))))
        elif op in ("conv2d", "dense", "max_pool2d", "upsampling"):
            self.nn(op, x if p <= 8 else self.add("cvm_clip", x, precision=8))
        else:  # get_valid_counts, non_max_suppression
            rows = self.add("reshape", x, shape=(1, -1, 6)) if np.prod(s) % 6 == 0 else None
            count = rows and self.add("get_valid_counts", rows, score_threshold=d(st.integers(-5, 5)))
            if count is not None:
                self.add("non_max_suppression", self.live[-1], count, iou_threshold=d(st.integers(1, 100)),
                         force_suppress=d(st.booleans()), top_k=d(st.integers(-1, 4)))

    def nn(self, op, x):
        d = self.draw
        s = x[1]
        if op == "dense":
            flat = x if len(s) == 2 else self.add("flatten", x)
            units = d(st.integers(1, 3))
            self.add(op, flat, self.param((units, flat[1][1]), 8), units=units, use_bias=False)
        elif len(s) != 4:
            return
        elif op == "conv2d":
            oc, k, g = d(st.integers(1, 3)), d(st.integers(1, 3)), d(st.sampled_from([1, s[1]]))
            ins = [x, self.param((oc * g, s[1] // g, k, k), 8)]
            if d(st.booleans()):
                ins.append(self.param((oc * g,), 12))
            self.add(op, *ins, channels=oc * g, kernel_size=(k, k), groups=g, padding=(d(st.integers(0, 1)),) * 2,
                     strides=(d(st.integers(1, 2)),) * 2, use_bias=len(ins) == 3)
        elif op == "max_pool2d":
            self.add(op, x, pool_size=(2, 2), strides=(d(st.integers(1, 2)),) * 2, padding=(d(st.integers(0, 1)),) * 2)
        else:
            self.add(op, x, scale=d(st.integers(1, 2)))

    def build(self):
        d = self.draw
        heads = [self.live[-1][0]] + [self.pick()[0] for _ in range(d(st.integers(0, 2)))]
        return self.b.build(*heads)


@st.composite
def graphs(draw):
    g = Graphs(draw)
    c, h = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    shape = draw(st.sampled_from([(1, c, h, h), (2, c * h), (c * h * 6,)]))
    p = draw(st.integers(1, 8))
    g.live.append((g.b.input("data", shape, p), shape, p))
    if draw(st.booleans()):
        g.live.append(g.param(shape, draw(st.integers(1, 12))))
    for _ in range(draw(st.integers(1, 8))):
        g.step()
    return g.build()


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_random_graphs_round_trip(data):
    flat = data.draw(st.booleans())
    graph = data.draw(graphs())
    imported = from_onnx(to_onnx(graph, inline=flat))
    assert_same(graph, imported)
    assert_same(graph, through_files(imported))


# -- the example models and ResNet-20 ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["digits_cnn", "detection", "transforms"])
@pytest.mark.parametrize("flat", [False, True])
def test_example_models_round_trip(name, flat):
    graph = cvm_onnx.load(MODELS / name).graph
    assert_same(graph, through_files(from_onnx(to_onnx(graph, inline=flat))))


def test_flat_slice_like_round_trips():
    """slice_like's lowering reads only the static shape of its second input, so no flat-form node consumes that
    tensor; the cvm.inputs marker still names it."""
    b = GraphBuilder()
    x = b.input("data", (2, 3), 8)
    like = b.param("like", np.zeros((1, 2), np.int8), 8)
    graph = b.build(b.op("slice_like", x, like, name="crop"))
    assert_same(graph, from_onnx(to_onnx(graph)))
    assert_same(graph, from_onnx(to_onnx(graph, inline=True)))


def test_flat_form_markers_are_verified():
    """A flat group whose marked inputs do not reproduce its nodes is refused, naming the node."""
    b = GraphBuilder()
    x = b.input("data", (2, 3), 8)
    y = b.param("y", np.ones((2, 3), np.int8), 8)
    graph = b.build(b.op("elemwise_sub", x, y, name="diff"))
    model = to_onnx(graph, inline=True)
    for n in model.graph.node:
        for p in n.metadata_props:
            if p.key == "cvm.inputs":
                p.value = '["y", "data:clamped"]'
    with pytest.raises(UnsupportedError) as e:
        from_onnx(model)
    assert [p.where for p in e.value.problems] == ["diff (elemwise_sub)"]


@pytest.mark.parametrize("flat", [False, True])
def test_resnet20_round_trip(resnet, flat):
    """Identical graph, node order included, and a byte-identical params file."""
    graph = resnet
    imported = from_onnx(to_onnx(graph, inline=flat))
    assert describe(graph) == describe(imported) and [n.name for n in graph.nodes] == [n.name for n in imported.nodes]
    precisions = lambda g: {n.name: n.outputs[0].precision for n in g.nodes if n.is_variable}  # noqa: E731
    assert write_params(imported.params, precisions(imported)) == write_params(graph.params, precisions(graph))
    assert_same(graph, through_files(imported))


def files_of(directory: Path) -> tuple[bytes, bytes]:
    return (directory / "symbol").read_bytes(), (directory / "params").read_bytes()


@pytest.mark.parametrize("form", [[], ["--inline"], ["--verify"]], ids=["function", "flat", "checked"])
@pytest.mark.parametrize("model_dir", ["digits_cnn", "detection", "transforms", "resnet20"], indirect=True)
def test_cli_convert_there_and_back(model_dir, form, tmp_path, capsys):
    """cvm-onnx convert DIR -o m.onnx, then convert m.onnx -o DIR2: symbol and params come back byte for byte
    (attributes as given, the dialect's layout, the params' order and stored types), whatever
    --input-precision says."""
    assert main(["convert", str(model_dir), "-o", str(tmp_path / "m.onnx"), *form]) == 0
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "back"), "--input-precision", "3"]) == 0
    assert files_of(tmp_path / "back") == files_of(model_dir)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_random_model_files_round_trip_byte_for_byte(data):
    """Any model file pair the writer produced, its params file in any order and with any stored type that
    holds the values, comes back byte for byte through either form."""
    graph = data.draw(graphs())
    order = data.draw(st.permutations(list(graph.params)))
    graph.params = {k: graph.params[k] for k in order}
    stored = {k: data.draw(st.sampled_from([np.int32] + [np.int8] * bool(np.abs(v).max(initial=0) <= 127)))
              for k, v in graph.params.items()}
    with tempfile.TemporaryDirectory() as d:
        src, m, back = Path(d) / "src", Path(d) / "m.onnx", Path(d) / "back"
        write_model(graph, src)
        (src / "params").write_bytes(write_params({k: v.astype(stored[k]) for k, v in graph.params.items()}))
        cvm_onnx.convert(src, m, inline=data.draw(st.booleans()))
        cvm_onnx.convert(m, back)
        assert files_of(back) == files_of(src)


def stored_symbol_changed(tmp_path, edit) -> tuple[bytes, bytes]:
    """The symbol written back after ``edit`` changed the exported model (and the original one)."""
    b = GraphBuilder()
    x = b.input("data", (2, 3), 8)
    graph = b.build(b.op("cvm_right_shift", x, name="shift", precision=4, shift_bit=1))
    write_model(graph, tmp_path / "src")
    model = to_onnx(cvm_onnx.load(tmp_path / "src").graph,
                    symbol=(tmp_path / "src" / "symbol").read_text())
    edit(model)
    cvm_onnx.write_onnx(model, tmp_path / "m.onnx")
    cvm_onnx.convert(tmp_path / "m.onnx", tmp_path / "back")
    return (tmp_path / "back" / "symbol").read_bytes(), (tmp_path / "src" / "symbol").read_bytes()


def test_stored_symbol_is_verified_not_trusted(tmp_path):
    """The stored symbol is written back only while it describes the graph imported: after the model's node is
    edited the writer's symbol (with the edit) comes back, and a broken stored symbol is ignored."""
    def edit_attr(model):
        [node] = [n for n in model.graph.node if n.name == "shift"]
        next(a for a in node.attribute if a.name == "shift_bit").i += 1

    back, original = stored_symbol_changed(tmp_path, edit_attr)
    assert back != original and cvm_onnx.load(tmp_path / "back").graph.nodes[1].attrs != \
        cvm_onnx.load(tmp_path / "src").graph.nodes[1].attrs

    def break_symbol(model):
        [p] = [p for p in model.metadata_props if p.key == "cvm.symbol.zlib"]
        p.value = p.value[:-3]

    back, original = stored_symbol_changed(tmp_path, break_symbol)
    assert back != original
    assert_same(cvm_onnx.load(tmp_path / "back").graph, cvm_onnx.load(tmp_path / "src").graph)


# -- the flat form is verified, not trusted ---------------------------------------------------------------------
def flat_model(op: str, *shapes, **attrs):
    b = GraphBuilder()
    ins = [b.input("data", shapes[0], 8)] + [b.param(f"p{k}", np.full(s, k + 2), 8) for k, s in enumerate(shapes[1:])]
    graph = b.build(b.op(op, *ins, name="node", **attrs))
    return graph, to_onnx(graph, inline=True)


@pytest.mark.parametrize("op", ["broadcast_div", "broadcast_sub", "elemwise_sub", "concatenate"])
def test_flat_input_order_is_recovered(op):
    """Lowerings that read their second input first (broadcast_div tests the divisor first) come back in order."""
    graph, model = flat_model(op, (2, 3), (2, 3))
    assert_same(graph, from_onnx(model))


def test_flat_repeated_input_is_recovered():
    b = GraphBuilder()
    x = b.input("data", (2, 3), 8)
    graph = b.build(b.op("broadcast_mul", x, x, name="square"), b.op("concatenate", x, x, x, axis=0, name="cat"))
    assert_same(graph, from_onnx(to_onnx(graph, inline=True)))


def test_flat_markers_that_lie_are_refused():
    """A flat-form node whose markers disagree with what its nodes compute is not imported as the marked op."""
    graph, model = flat_model("broadcast_add", (2, 3), (2, 3))
    for n in model.graph.node:
        for p in n.metadata_props:
            if p.key == "cvm.op":
                p.value = "broadcast_sub"
    with pytest.raises(UnsupportedError) as e:
        from_onnx(model)
    assert e.value.problems[0].where == "node (broadcast_sub)"
    graph, model = flat_model("clip", (2, 3), a_min=-3, a_max=5)
    for n in model.graph.node:
        for p in n.metadata_props:
            if p.key == "cvm.attrs":
                p.value = json.dumps({"a_min": -3, "a_max": 6})
    with pytest.raises(UnsupportedError, match=r"node \(clip\): its flat-form nodes are not the exporter's lowering "
                                               r"of clip on its marked inputs"):
        from_onnx(model)


def test_round_trip_keeps_declared_input_precision_and_repeated_heads():
    b = GraphBuilder()
    x = b.input("data", (3,), 5)
    w = b.param("w", np.array([1, -7, 3]), 4)
    y = b.op("broadcast_add", x, w, name="y")
    graph = b.build(y, y, x, w)
    for flat in (False, True):
        imported = from_onnx(to_onnx(graph, inline=flat), input_precision=8)
        assert_same(graph, imported)
        assert imported.nodes[imported.inputs[0]].outputs[0].precision == 5
    onnx.checker.check_model(to_onnx(graph))


@settings(max_examples=50, deadline=None)
@given(st.text())
def test_packed_symbol_unpacks_to_its_text(text):
    assert unpack_symbol(pack_symbol(text), limit=len(text.encode())) == text


def test_packed_symbol_is_unpacked_within_its_limit():
    """A small value inflating to 100 MB (or a broken one) is refused without allocating it: the import then
    writes the runtime writer's symbol."""
    bomb = pack_symbol(" " * 100_000_000)
    assert len(bomb) < 200_000 and unpack_symbol(bomb, limit=1 << 20) is None
    text = '{"nodes": []}'
    assert unpack_symbol(pack_symbol(text), limit=len(text) - 1) is None
    assert unpack_symbol("not base64!", limit=100) is None
    assert unpack_symbol(pack_symbol(text)[:-4], limit=100) is None
