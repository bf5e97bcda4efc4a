"""The serving passes (converters/to_onnx/optimize.py): int32 round trips between float bodies dropped, results
unchanged bit for bit (onnxruntime on the optimized model == the reference executor)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from support import graphs, tensors

from cvm_onnx.app.api import load
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.sessions import run
from cvm_onnx.serving.target import Target

FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE)


def check(graph, feeds, int8: bool | None = None) -> onnx.ModelProto:
    model = to_onnx(graph, Target.default() if int8 is None else Target(products="integer" if int8 else "float"))
    onnx.checker.check_model(model, full_check=True)
    want = execute(graph, feeds)
    got = run(model, feeds)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    return model


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    return {vi.name: vi.type.tensor_type.elem_type
            for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}


def round_trips(model: onnx.ModelProto) -> list[str]:
    """Casts to a float type reading a Cast to int32 of a float tensor (what the pass removes)."""
    types = elem_types(model)
    producer = {o: n for n in model.graph.node for o in n.output}

    def cast_to(n):
        return n.attribute[0].i if n.op_type == "Cast" else None

    return [n.name for n in model.graph.node
            if cast_to(n) in FLOATS and (p := producer.get(n.input[0])) is not None
            and cast_to(p) == TensorProto.INT32 and types.get(p.input[0]) in FLOATS]


@settings(max_examples=25, deadline=None)
@given(case=graphs())
def test_random_graphs_stay_exact(case):
    graph, feeds = case
    model = check(graph, feeds)
    assert round_trips(model) == []
    assert "Round" not in {n.op_type for n in model.graph.node if any(p.key == "cvm.fused" for p in n.metadata_props)}


def conv_chain(rng, head_inside: bool):
    """conv2d -> shift -> conv2d -> shift -> broadcast_mul (per channel) -> shift (float64) -> conv2d: float
    bodies meeting in float32 and float64 (no requantization run without the native kernels: a per-channel
    product is a step of native runs only); optionally the first shift is also a head (its int32 must stay)."""
    b = GraphBuilder()
    x = b.input("data", (1, 3, 6, 6), 8)

    def conv(e, k):
        w = b.param(f"w{k}", rng.integers(-127, 128, (3, 3, 3, 3)), 8)
        bias = b.param(f"b{k}", rng.integers(-1000, 1000, (3,)), 12)
        return b.op("conv2d", e, w, bias, channels=3, kernel_size=(3, 3), padding=(1, 1))

    s1 = b.op("cvm_right_shift", conv(x, 0), shift_bit=8, precision=8)
    t = b.op("cvm_right_shift", conv(s1, 1), shift_bit=4, precision=16)
    m = b.op("broadcast_mul", t, b.param("scale", np.array([30000, 20000, 10000]).reshape(3, 1, 1), 16))
    s2 = b.op("cvm_right_shift", m, shift_bit=20, precision=8)
    y = conv(s2, 2)
    return b.build(y, s1) if head_inside else b.build(y)


@pytest.mark.parametrize("head_inside", [False, True])
def test_float32_and_float64_bodies(head_inside):
    rng = np.random.default_rng(3)
    graph = conv_chain(rng, head_inside)
    flat = to_onnx(graph, inline=True)
    for seed in range(3):
        model = check(graph, {"data": rng.integers(-127, 128, (1, 3, 6, 6)).astype(np.int32)}, int8=False)
    assert round_trips(flat) and not round_trips(model)
    types = elem_types(model)
    assert any(n.op_type == "Cast" and types[n.input[0]] == TensorProto.DOUBLE and n.attribute[0].i == TensorProto.FLOAT
               for n in model.graph.node)  # the float64 shift's result goes straight to the float32 Conv
    outputs = [o.name for o in model.graph.output]
    assert ("cvm_right_shift_" in " ".join(outputs)) == head_inside
    assert model.metadata_props[-1].key == "cvm.optimized"


def test_int32_ops_keep_their_casts():
    """negative between two float bodies computes on int32: the casts around it stay (nothing to drop)."""
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    x = b.input("data", (1, 2, 5, 5), 8)
    y = b.op("cvm_right_shift", b.op("negative", b.op("cvm_right_shift", x, shift_bit=2, precision=8)),
             shift_bit=1, precision=8)
    graph = b.build(y)
    model = check(graph, {"data": rng.integers(-127, 128, (1, 2, 5, 5)).astype(np.int32)})
    assert len(model.graph.node) == len(to_onnx(graph, inline=True).graph.node)


@settings(max_examples=10, deadline=None)
@given(data=tensors((1, 3, 32, 32), 8), seed=st.integers(0, 2**32 - 1))
def test_resnet20(resnet_dir, data, seed):
    graph = load(resnet_dir).graph
    model = to_onnx(graph, Target.default())  # with the native library: integer products (test_int8.py)
    float32 = to_onnx(graph, Target(products="float"))
    flat = to_onnx(graph, inline=True)
    assert not round_trips(model) and not round_trips(float32) and len(float32.graph.node) < len(flat.graph.node)
    noise = np.random.default_rng(seed).integers(-127, 128, data.shape).astype(np.int32)
    feeds = {"data": np.where(data == 0, noise, data).astype(np.int32)}
    assert np.array_equal(run(model, feeds)[0], execute(graph, feeds)[0])


def test_the_serving_form_refuses_to_import_with_one_clear_error(tmp_path, capsys):
    from cvm_onnx.app.cli import main
    from cvm_onnx.converters.from_onnx import from_onnx
    from cvm_onnx.core.errors import UnsupportedError

    model = to_onnx(conv_chain(np.random.default_rng(5), False), Target.default())
    with pytest.raises(UnsupportedError, match="serving form"):
        from_onnx(model)
    onnx.save(model, tmp_path / "s.onnx")
    assert main(["convert", str(tmp_path / "s.onnx"), "-o", str(tmp_path / "back")]) == 4
    err = capsys.readouterr().err
    assert "--optimize" in err and err.count("\n") == 1 and not (tmp_path / "back").exists()


def test_serving_passes_keep_their_conditions_and_leave_the_export_alone():
    """Each pass of the serving form has its own name; what each requires holds on the flat form, what it ensures
    holds after it (each also past the ones before); running them copies the exported model once and leaves it
    as it was."""
    from cvm_onnx.serving.flat import SERVING
    from cvm_onnx.serving.passes import Sequential

    assert len({p.name for p in SERVING}) == len(SERVING)
    flat = to_onnx(conv_chain(np.random.default_rng(6), True), inline=True)
    before = flat.SerializeToString(deterministic=True)
    result = Sequential(SERVING)(flat)
    served = result.model
    assert result.modified
    assert flat.SerializeToString(deterministic=True) == before
    assert not round_trips(served) and round_trips(flat)
    assert {c.says: c.broken(flat) for p in SERVING for c in p.requires} == {c.says: [] for p in SERVING
                                                                           for c in p.requires}
    assert {c.says: c.broken(served) for p in SERVING for c in p.ensures} == {c.says: [] for p in SERVING
                                                                            for c in p.ensures}


def test_a_pass_given_a_broken_model_is_an_invariant_error():
    """A pass run on what it does not require (the function form; a node reading a tensor made after it) stops
    before rewriting, naming itself, the condition and the place."""
    from cvm_onnx.serving.flat import drop_unread_casts
    from cvm_onnx.serving.passes import InvariantError

    graph = conv_chain(np.random.default_rng(7), False)
    with pytest.raises(InvariantError, match=r"drop_unread_casts requires the flat form .*broken at "):
        drop_unread_casts(to_onnx(graph))
    flat = to_onnx(graph, inline=True)
    flat.graph.node[0].input.append("later")
    flat.graph.node[-1].output.append("later")
    with pytest.raises(InvariantError, match=r"requires every tensor read made before it is read; broken at later"):
        drop_unread_casts(flat)


@pytest.mark.parametrize("name", ["drop_unread_casts", "drop_unread_params", "drop_stale_value_info"])
def test_a_pass_that_breaks_what_it_ensures_is_an_invariant_error(name):
    """The same pass with its rewrite left out (the model returned as given) fails its own ensures on the
    exported flat form, which has what each pass removes."""
    import dataclasses

    from cvm_onnx.serving import flat as passes
    from cvm_onnx.serving.passes import InvariantError

    flat = to_onnx(conv_chain(np.random.default_rng(8), False), inline=True)
    flat = passes.skip_int32_round_trips(flat).model  # casts left unread, as in the serving form's first pass
    flat.graph.value_info.add(name="gone")
    flat.graph.initializer.add(name="unread", data_type=TensorProto.INT32)
    lazy = dataclasses.replace(getattr(passes, name), run=lambda m: m)
    with pytest.raises(InvariantError, match=rf"serving pass {name} ensures "):
        lazy(flat)
    assert getattr(passes, name)(flat).modified  # the pass itself keeps its word


def clips(model: onnx.ModelProto) -> int:
    return sum(n.op_type == "Clip" for n in model.graph.node)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 32), lo=st.integers(-2**30, 2**30 - 1), width=st.integers(1, 2**31),
       data=st.lists(st.integers(-2**31, 2**31 - 1), min_size=6, max_size=6), read_twice=st.booleans())
def test_the_input_clamp_and_a_clip_become_one_clip(p, lo, width, data, read_twice):
    """The input's clamp to its precision followed by a CVM clip (bounds within, across or beyond the clamp's) is
    one Clip in the serving form, exact on any int32 data, the input's declared precision kept; a clamped input
    that another op also reads keeps both."""
    from cvm_onnx.runtime.sessions import declared_precision

    b = GraphBuilder()
    x = b.input("data", (6,), p)
    y = b.op("clip", x, a_min=lo, a_max=min(lo + width, 2**30))
    graph = b.build(b.op("negative", x), y) if read_twice else b.build(y)
    model = check(graph, {"data": np.array(data, np.int32)})
    assert clips(model) == (2 if read_twice else 1) and declared_precision(model, "data") == p


@settings(max_examples=60, deadline=None)
@given(bounds=st.lists(st.integers(-5, 5), min_size=6, max_size=6),
       data=st.lists(st.integers(-2**31, 2**31 - 1), min_size=4, max_size=4) | st.just(list(range(-8, 9))))
def test_merged_clips_equal_the_chain_for_any_bounds(bounds, data):
    """Three Clips in a row with any constant int32 bounds (crossed ones, lo > hi, included) become one, with the
    chain's value for every x (onnxruntime on both models)."""
    from onnx import helper, numpy_helper

    from cvm_onnx.serving.flat import merge_clip_pairs
    from cvm_onnx.core.format.onnx_file import onnx_model

    nodes = [helper.make_node("Constant", [], [f"c{k}"], value=numpy_helper.from_array(np.array(v, np.int32)))
             for k, v in enumerate(bounds)]
    nodes += [helper.make_node("Clip", [t, f"c{2 * k}", f"c{2 * k + 1}"], [f"y{k}"])
              for k, t in enumerate(["x", "y0", "y1"])]
    x = np.array(data, np.int32)
    model = onnx_model(helper.make_graph(  # the IR version opset 17 needs: onnxruntime 1.31 reads up to 13
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [len(data)])],
        [helper.make_tensor_value_info("y2", TensorProto.INT32, [len(data)])]), opset=17)
    want = run(model, {"x": x})[0]
    merged = merge_clip_pairs(model).model
    assert clips(merged) == 1 and len(merged.graph.node) <= 3
    assert np.array_equal(run(merged, {"x": x})[0], want)
