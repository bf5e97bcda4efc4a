"""The gas: validation's figure against an oracle written from the runtime's ``CvmRuntime::GetOps``
(src/runtime/infer_attr.cc), reading the symbol file as the runtime does; the three limits refused naming the node;
the commands that print it."""
from __future__ import annotations

import json
import re
from math import prod
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import graphs, reduce_case, single_op
from support.fuzz import files_of

from cvm_onnx.app.cli import main
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import ValidationError
from cvm_onnx.core.format import read_model, write_model
from cvm_onnx.core.graph import Entry, Graph, Node
from cvm_onnx.core.ops import type_node
from cvm_onnx.core.validate import validate

FAST = settings(max_examples=60, deadline=None)
MODELS_DETECTION = Path(__file__).resolve().parents[2] / "models" / "detection"


def getops_oracle(symbol: str) -> tuple[int, int, list[str]]:
    """(ops, memory, the names of the nodes where the runtime stops): GetOps over the symbol's nodes in order.

    A variable adds 5 x its size to the memory. An op adds base x the size of its output 0 to the ops (base: dense
    3 * weight.shape[1] + use_bias; conv2d 3 * weight.size / weight.shape[0] + use_bias; max_pool2d the product of
    pool_size; sum input size / output size; non_max_suppression 20 * data.shape[0]; else 1; the branch meant
    for get_valid_counts tests the name "get_valid_count", so it never changes the output counted) and 5 x the
    size of all its outputs to the memory. It stops where base > 2^30, where the ops pass 2^40 and where the
    memory passes 2^40."""
    sym = json.loads(symbol)
    row = sym["node_row_ptr"]
    shapes = sym["attrs"]["shape"][1]
    op_attrs = sym["attrs"].get("op_attrs", ["list_str", []])[1]
    size = lambda eid: prod(shapes[eid])  # noqa: E731
    ops = memory = 0
    stops = []
    for nid, node in enumerate(sym["nodes"]):
        if node["op"] == "null":
            memory += size(row[nid]) * 5
        else:
            name = re.sub(r"_\d+$", "", node["attrs"]["func_name"])
            attrs = json.loads(op_attrs[nid]) if nid < len(op_attrs) and op_attrs[nid] else {}
            bias = 0 if attrs.get("use_bias", "True").lower() in ("false", "0") else 1
            ins = [row[i] + k for i, k, _ in node["inputs"]]
            base = 1
            if name == "dense":
                base = shapes[ins[1]][1] * 3 + bias
            elif name == "non_max_suppression":
                base = shapes[ins[0]][0] * 20
            elif name == "conv2d":
                base = size(ins[1]) // shapes[ins[1]][0] * 3 + bias
            elif name == "max_pool2d":
                base = prod(int(v) for v in re.findall(r"-?\d+", attrs["pool_size"]))
            elif name == "sum":
                base = size(ins[0]) // size(row[nid])
            if base > 1 << 30:
                stops.append(node["name"])
            before = ops
            ops += base * size(row[nid])
            if before <= 1 << 40 < ops:
                stops.append(node["name"])
            before = memory
            memory += sum(size(e) for e in range(row[nid], row[nid + 1])) * 5
            if before <= 1 << 40 < memory:
                stops.append(node["name"])
            continue
        if memory - size(row[nid]) * 5 <= 1 << 40 < memory:
            stops.append(node["name"])
    return ops, memory, stops


def agrees(graph: Graph) -> None:
    gas = validate(graph, inputs=tuple(graph.nodes[i].name for i in graph.inputs)).gas
    ops, memory, stops = getops_oracle(files_of(graph)[0])
    assert (gas.ops, gas.memory, gas.total) == (ops, memory, ops + memory)
    assert stops == []


@FAST
@given(graphs())
def test_random_graphs_agree_with_the_oracle(case):
    agrees(case[0])


def _values(draw, shape, p=8):
    return np.asarray(draw(st.lists(st.integers(-(1 << (p - 1)) + 1, (1 << (p - 1)) - 1), min_size=prod(shape),
                                    max_size=prod(shape))), np.int32).reshape(shape)


@FAST
@given(st.data())
def test_conv2d_and_dense_agree_with_the_oracle(data):
    draw = data.draw
    use_bias = draw(st.booleans())
    if draw(st.booleans()):
        g, cg, ocg = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
        kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        h, w = draw(st.integers(3, 7)), draw(st.integers(3, 7))
        x = np.zeros((draw(st.integers(1, 3)), g * cg, h, w), np.int32)
        inputs = [(x, 8, False), (_values(draw, (g * ocg, cg, kh, kw)), 8, True)]
        if use_bias:
            inputs.append((_values(draw, (g * ocg,)), 8, True))
        graph, _ = single_op("conv2d", inputs, channels=g * ocg, kernel_size=(kh, kw), groups=g, use_bias=use_bias,
                             strides=(draw(st.integers(1, 3)),) * 2, padding=(draw(st.integers(0, 2)),) * 2)
    else:
        m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 40)), draw(st.integers(1, 6))
        inputs = [(np.zeros((m, k), np.int32), 8, False), (_values(draw, (n, k)), 8, True)]
        if use_bias:
            inputs.append((_values(draw, (n,)), 8, True))
        graph, _ = single_op("dense", inputs, units=n, use_bias=use_bias)
    agrees(graph)


@FAST
@given(st.data())
def test_max_pool2d_agrees_with_the_oracle(data):
    draw = data.draw
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    kh, kw = draw(st.integers(ph + 1, h + 2 * ph)), draw(st.integers(pw + 1, w + 2 * pw))
    graph, _ = single_op("max_pool2d", [(np.zeros((1, 2, h, w), np.int32), 8, False)], pool_size=(kh, kw),
                         padding=(ph, pw), strides=(draw(st.integers(1, 3)), draw(st.integers(1, 3))))
    agrees(graph)


@FAST
@given(reduce_case())
def test_reductions_agree_with_the_oracle(case):
    op, attrs, p, x = case
    graph, _ = single_op(op, [(x, min(p, 16), False)], **attrs)
    agrees(graph)


@FAST
@given(st.integers(1, 3), st.integers(1, 9), st.booleans())
def test_detection_ops_agree_with_the_oracle(batch, rows, force):
    b = GraphBuilder()
    counts, data = b.op("get_valid_counts", b.input("data", (batch, rows, 6), 8), score_threshold=0)
    agrees(b.build(b.op("non_max_suppression", data, counts, force_suppress=force), counts))


@pytest.mark.parametrize("model_dir", ["digits_cnn", "detection", "transforms", "resnet20"], indirect=True)
def test_models_agree_with_the_oracle(model_dir):
    gas = validate(read_model(model_dir)).gas
    ops, memory, stops = getops_oracle((model_dir / "symbol").read_text())
    assert (gas.ops, gas.memory, stops) == (ops, memory, [])


# -- the limits ---------------------------------------------------------------------------------------------------
def _big_pool(b: GraphBuilder, x: Entry) -> Entry:
    """max_pool2d of a 32769 x 32769 window: 32769^2 = 2^30 + 65537 comparisons per output."""
    return b.op("max_pool2d", x, name="huge_window", pool_size=(32769, 32769), padding=(4096, 4096))


def _unchecked(b: GraphBuilder, heads: list[Entry]) -> Graph:
    """The builder's graph with every op node's output types inferred, the limits not checked."""
    nodes = list(b.nodes)
    for i, n in enumerate(nodes):
        if not n.is_variable:
            types = [nodes[e.node].outputs[e.index] for e in n.inputs]
            nodes[i] = replace(n, outputs=type_node(n.op, n.attrs, types).outputs)
    return Graph(nodes, heads, dict(b.params))


def test_base_ops_past_2_30_are_refused_naming_the_node():
    b = GraphBuilder()
    x = b.input("data", (1, 1, 24577, 24577), 8)
    graph = _unchecked(b, [_big_pool(b, x)])
    with pytest.raises(ValidationError) as e:
        validate(graph)
    assert [p.where for p in e.value.problems] == ["huge_window"]
    assert "1073807361 ops per output element" in str(e.value) and "2^30" in str(e.value)
    assert getops_oracle(files_of(graph)[0])[2] == ["huge_window"]


def test_a_window_of_2_30_is_within_the_limit():
    b = GraphBuilder()
    x = b.input("data", (1, 1, 24576, 24576), 8)
    y = b.op("max_pool2d", x, pool_size=(32768, 32768), padding=(4096, 4096))
    assert validate(_unchecked(b, [y])).gas.nodes[-1].base_ops == 1 << 30


def _wide_conv(b: GraphBuilder, x: Entry, name: str) -> Entry:
    """64 channels of 3 * 1024 * 9 ops per output over 1024 x 1024: 1.85e12 ops > 2^40."""
    w = b.param(f"{name}_w", np.ones((64, 1024, 3, 3), np.int8), 2)
    return b.op("conv2d", x, w, name=name, channels=64, kernel_size=(3, 3), padding=(1, 1), use_bias=False)


def test_ops_past_2_40_are_refused_at_the_node_that_passes():
    b = GraphBuilder()
    x = b.input("data", (1, 1024, 1024, 1024), 8)
    small = b.op("relu", x, name="before")
    graph = _unchecked(b, [_wide_conv(b, small, "passes"), b.op("relu", small, name="after")])
    with pytest.raises(ValidationError) as e:
        validate(graph)
    assert [p.where for p in e.value.problems] == ["passes"]
    assert "past the runtime's limit 2^40" in str(e.value)
    assert getops_oracle(files_of(graph)[0])[2] == ["passes"]


def test_memory_past_2_40_is_refused_at_the_node_that_passes():
    """205 relus of 2^30 elements: memory 5 * 206 * 2^30 > 2^40 first at the 205th, ops 205 * 2^30 within."""
    b = GraphBuilder()
    y = b.input("data", (64, 1 << 24), 8)
    for k in range(210):
        y = b.op("relu", y, name=f"relu{k}")
    graph = _unchecked(b, [y])
    with pytest.raises(ValidationError) as e:
        validate(graph)
    first = next(k for k in range(210) if 5 * (k + 2) * (1 << 30) > 1 << 40)
    assert [p.where for p in e.value.problems] == [f"relu{first}"]
    assert "memory cost" in str(e.value)
    assert getops_oracle(files_of(graph)[0])[2] == [f"relu{first}"]


def test_every_limit_and_rule_is_listed_at_once():
    b = GraphBuilder()
    x = b.input("data", (1, 1024, 1024, 1024), 8)
    conv = _wide_conv(b, x, "wide")
    pool = _big_pool(b, b.op("reshape", x, shape=(1, 1, 32768, 32768), name="square"))
    bad = b.op("relu", x, name="bad")
    graph = _unchecked(b, [conv, pool, bad])
    good = graph.nodes[bad.node]
    graph.nodes[bad.node] = Node("bad", "relu", (Entry(99),))  # a rule broken: no node 99
    with pytest.raises(ValidationError) as e:
        validate(graph)
    assert {p.where for p in e.value.problems} == {"huge_window", "bad"}, "totals wait for every node to type"
    graph.nodes[bad.node] = good
    with pytest.raises(ValidationError) as e:
        validate(graph)
    assert [p.where for p in e.value.problems] == ["wide", "huge_window"]
    assert getops_oracle(files_of(graph)[0])[2] == ["wide", "huge_window"]


def test_validate_refuses_a_model_past_a_limit_with_exit_3(tmp_path, capsys):
    b = GraphBuilder()
    x = b.input("data", (1, 1, 24577, 24577), 8)
    write_model(_unchecked(b, [_big_pool(b, x)]), tmp_path / "m")
    assert main(["validate", str(tmp_path / "m")]) == 3
    err = capsys.readouterr().err
    assert "invalid model: huge_window: max_pool2d: 1073807361 ops per output element" in err


# -- the commands -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["info", "validate"])
def test_info_and_validate_print_the_gas(command, capsys):
    ops, memory, _ = getops_oracle((MODELS_DETECTION / "symbol").read_text())
    assert main([command, str(MODELS_DETECTION)]) == 0
    assert f"gas {ops + memory} = ops {ops} + memory {memory}" in capsys.readouterr().out


def test_convert_prints_the_gas_both_ways(tmp_path, capsys):
    ops, memory, _ = getops_oracle((MODELS_DETECTION / "symbol").read_text())
    line = f"gas {ops + memory} = ops {ops} + memory {memory}"
    assert main(["convert", str(MODELS_DETECTION), "-o", str(tmp_path / "d.onnx")]) == 0
    assert line in capsys.readouterr().out
    assert main(["convert", str(MODELS_DETECTION), "-o", str(tmp_path / "d.onnx"), "--report",
                 str(tmp_path / "r.md")]) == 0
    assert line in capsys.readouterr().out and line in (tmp_path / "r.md").read_text()
    assert main(["convert", str(tmp_path / "d.onnx"), "-o", str(tmp_path / "back"), "--report",
                 str(tmp_path / "i.md")]) == 0
    assert line in capsys.readouterr().out and line in (tmp_path / "i.md").read_text()




def test_quantize_prints_the_gas_and_what_two_part_products_add(tmp_path, capsys):
    digits = MODELS_DETECTION.parent / "digits_cnn"
    args = ["quantize", str(digits / "float.onnx"), "--calibration", str(digits / "calibration.npy"),
            "--per-channel", "--activation", "int8", "-o"]
    assert main(args + [str(tmp_path / "one"), "--one-part"]) == 0
    out = capsys.readouterr().out.splitlines()
    ops, memory, _ = getops_oracle((tmp_path / "one" / "symbol").read_text())
    assert f"gas {ops + memory} = ops {ops} + memory {memory} (the runtime's GetOps)" in out
    [runs] = [t for t in out if "in runs of channels" in t]  # relu2's channel scales take two runs
    assert runs.startswith("  the 1 requantization(s) in runs of channels (relu2_QuantizeLinear): gas ")
    assert 0 < int(runs.split("gas ")[1].split(",")[0]) < ops + memory
    assert main(args + [str(tmp_path / "two"), "--two-part", "--save-onnx", str(tmp_path / "q.onnx")]) == 0
    out = capsys.readouterr().out.splitlines()
    ops2, memory2, _ = getops_oracle((tmp_path / "two" / "symbol").read_text())
    assert f"gas {ops2 + memory2} = ops {ops2} + memory {memory2} (the runtime's GetOps)" in out
    assert any(t.startswith("  the 3 requantization(s) in products in parts") for t in out)
    one_part = (f"in one-part products the same model's gas is {ops + memory} (ops {ops}, memory {memory}): "
                f"products in parts add {ops2 + memory2 - ops - memory:+d}")
    assert f"  {one_part}" in out
    report = tmp_path / "r.md"
    assert main(["convert", str(tmp_path / "q.onnx"), "-o", str(tmp_path / "back"), "--two-part", "--report",
                 str(report)]) == 0
    assert f"- {one_part}" in report.read_text().splitlines()
    assert main(args + [str(tmp_path / "default")]) == 0  # two-part products are the default
    for name in ("symbol", "params"):
        assert (tmp_path / "default" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
