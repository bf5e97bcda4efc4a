"""The writer's storage plan: every entry its own storage id while that fits the runtime's 2^32-byte bound (the
files written so far, byte for byte), storages reused past it, by the rules the runtime and the params need.

``plan_problems`` and ``run_in_storages`` are this test's own: a rule checker over the written plan and an
executor that keeps every entry in the storage the plan gives it (one flat int32 buffer per storage id, sized by
its largest entry, as the runtime allocates), so a plan that lets a live value be overwritten changes a result.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cvm_onnx.app import cli
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import ValidationError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import read_model, read_symbol, write_model, write_symbol
from cvm_onnx.core.format.storage import reuse_plan
from cvm_onnx.core.graph import Entry, Graph
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.core.validate import storage_bytes, validate

BOUND = 1 << 32
MODELS = Path(__file__).resolve().parents[2] / "models"


def entries(graph: Graph) -> list[Entry]:
    """The written entries in entry order (a variable writes one)."""
    return [Entry(i, k) for i, n in enumerate(graph.nodes) for k in range(1 if n.is_variable else len(n.outputs))]


def plan_problems(graph: Graph, sids: list[int]) -> list[str]:
    """Every rule the plan ``sids`` breaks: variables alone in their storage, no op output in an input's storage
    or another output's, no two entries live at once in one storage (an entry lives from its writer to its last
    reader, a head to the end, an unread entry at its writer only)."""
    es = entries(graph)
    if len(sids) != len(es):
        return [f"{len(sids)} storage ids for {len(es)} entries"]
    sid = dict(zip(es, sids))
    out = []
    live = {e: [e.node, e.node] for e in es}
    for i, n in enumerate(graph.nodes):
        for e in n.inputs:
            live[e][1] = i
    for h in graph.heads:
        live[h][1] = len(graph.nodes)
    for a in es:
        for b in es:
            if a == b or sid[a] != sid[b]:
                continue
            if graph.nodes[a.node].is_variable:
                out.append(f"variable {graph.nodes[a.node].name} shares storage {sid[a]} with {b}")
            if a.node == b.node:
                out.append(f"outputs {a} and {b} of one node share storage {sid[a]}")
            if any(e == a for e in graph.nodes[b.node].inputs):
                out.append(f"{b} is written in the storage {sid[a]} of its input {a}")
            if not (live[a][1] < live[b][0] or live[b][1] < live[a][0]):
                out.append(f"{a} (live {live[a]}) and {b} (live {live[b]}) share storage {sid[a]}")
    return out


def run_in_storages(graph: Graph, sids: list[int], x: np.ndarray) -> list[np.ndarray]:
    """The heads of ``graph`` run with every entry kept in its planned storage (buffers start as garbage)."""
    sid = dict(zip(entries(graph), sids))
    size = {}
    for e, s in sid.items():
        size[s] = max(size.get(s, 0), int(np.prod(graph.type_of(e).shape)))
    rng = np.random.default_rng(0)
    buffers = {s: rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for s, n in size.items()}

    def view(e: Entry) -> np.ndarray:
        shape = graph.type_of(e).shape
        return buffers[sid[e]][:int(np.prod(shape))].reshape(shape)

    for i, n in enumerate(graph.nodes):
        if n.is_variable:
            view(Entry(i))[...] = graph.params[n.name] if n.name in graph.params else x
            continue
        op = REGISTRY[n.op]
        outs = op.run(op.bind(n.attrs), [view(e).copy() for e in n.inputs])
        for k, value in enumerate(outs):
            view(Entry(i, k))[...] = value
    return [view(h).copy() for h in graph.heads]


@st.composite
def dags(draw):
    """A random valid graph: an input of random shape, params, unary and binary elementwise ops, repeat (larger
    tensors), flatten, get_valid_counts (two outputs, either unread), any entries as heads (middle ones too)."""
    b = GraphBuilder()
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    pool = [b.input("data", shape, 8)]
    shapes = {pool[0]: shape}
    for k in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["unary", "binary", "param", "repeat", "flatten", "gvc"]))
        x = draw(st.sampled_from(pool))
        s = shapes[x]
        name = f"n{k}"
        if kind == "unary":
            op, attrs = draw(st.sampled_from([("relu", {}), ("abs", {}), ("negative", {}),
                                              ("cvm_clip", {"precision": 6}),
                                              ("cvm_right_shift", {"precision": 8, "shift_bit": 1})]))
            new = {b.op(op, x, name=name, **attrs): s}
        elif kind == "binary":
            y = draw(st.sampled_from([e for e in pool if shapes[e] == s]))
            op = draw(st.sampled_from(["elemwise_add", "elemwise_sub"]))
            new = {b.op("cvm_clip", b.op(op, x, y, name=name), name=f"{name}c", precision=8): s}
        elif kind == "param":
            p = b.param(f"w{k}", np.full(s, draw(st.integers(-127, 127)), np.int8), 8)
            new = {p: s, b.op("cvm_clip", b.op("elemwise_add", x, p, name=name), name=f"{name}c", precision=8): s}
        elif kind == "repeat" and np.prod(s) <= 64:
            axis, repeats = draw(st.integers(0, len(s) - 1)), draw(st.integers(1, 3))
            new = {b.op("repeat", x, name=name, repeats=repeats, axis=axis):
                   s[:axis] + (s[axis] * repeats,) + s[axis + 1:]}
        elif kind == "flatten" and len(s) >= 2:
            new = {b.op("flatten", x, name=name): (s[0], int(np.prod(s[1:])))}
        elif kind == "gvc" and len(s) == 3 and 2 <= s[2]:
            counts, rows = b.op("get_valid_counts", x, name=name, score_threshold=draw(st.integers(-5, 5)))
            new = {counts: s[:1], rows: s}
        else:
            continue
        shapes.update(new)
        pool.extend(new)
    heads = draw(st.lists(st.sampled_from(pool), max_size=3)) + [pool[-1]]
    return b.build(*heads)


@settings(deadline=None)
@given(dags(), st.integers(0, 2**32 - 1))
def test_the_reused_plan_keeps_every_rule_and_every_value(graph, seed):
    sids = reuse_plan(graph.nodes, graph.heads)
    assert plan_problems(graph, sids) == []
    x = np.random.default_rng(seed).integers(-127, 128, graph.type_of(Entry(0)).shape).astype(np.int32)
    expected = execute(graph, x)
    for got, want in zip(run_in_storages(graph, sids, x), expected, strict=True):
        assert np.array_equal(got, want)


def test_the_checks_catch_a_head_overwritten_later():
    """A plan that writes the last op into the storage of a head in the middle breaks the liveness rule and
    changes that head's value."""
    b = GraphBuilder()
    x = b.input("data", (2, 3), 8)
    mid = b.op("negative", x, name="mid")
    y = b.op("relu", b.op("abs", mid, name="a"), name="y")
    graph = b.build(mid, y)
    bad = [0, 1, 2, 1]
    assert plan_problems(graph, bad) == ["Entry(node=1, index=0) (live [1, 4]) and Entry(node=3, index=0) "
                                         "(live [3, 4]) share storage 1",
                                         "Entry(node=3, index=0) (live [3, 4]) and Entry(node=1, index=0) "
                                         "(live [1, 4]) share storage 1"]
    x = np.arange(-3, 3, dtype=np.int32).reshape(2, 3)
    assert not np.array_equal(run_in_storages(graph, bad, x)[0], execute(graph, x)[0])


def chain(ops: int, heads: str = "last") -> Graph:
    """data (2^28 int32 values: 1 GiB) and ``ops`` elementwise ops in a chain, of 1 GiB each (no values)."""
    b = GraphBuilder()
    y = b.input("data", (16, 1 << 24), 8)
    made = []
    for k in range(ops):
        y = b.op(("negative", "relu")[k % 2], y, name=f"op{k}")
        made.append(y)
    return Graph(list(b.nodes), made if heads == "all" else [y], {})


def written_plan(graph: Graph) -> tuple[Graph, list[int], int]:
    """The graph the written symbol holds, its storage ids and the runtime's storage for them (from the file)."""
    doc = json.loads(text := write_symbol(graph))
    sids, shapes = doc["attrs"]["storage_id"][1], doc["attrs"]["shape"][1]
    size: dict[int, int] = {}
    for sid, shape in zip(sids, shapes):
        size[sid] = max(size.get(sid, 0), 4 * int(np.prod(shape)))
    return validate(read_symbol(text)).graph, sids, sum(size.values())


def test_a_graph_past_the_bound_reuses_storage_validates_and_writes(tmp_path):
    """Five entries of 1 GiB pass the bound each in its own storage (validation refused the graph, exit 3); the
    written plan reuses storage, keeps every rule and needs 3 GiB, validation measures that plan, `validate`
    accepts the model directory and reading and writing it again gives the same symbol."""
    graph = validate(chain(4)).graph
    read, sids, size = written_plan(graph)
    assert plan_problems(read, sids) == []
    assert sids == [0, 1, 2, 1, 2] and size == 3 << 30
    assert storage_bytes(graph) == size
    write_model(graph, tmp_path / "m")
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["validate", str(tmp_path / "m")]) == 0
    text = (tmp_path / "m" / "symbol").read_text()
    assert write_symbol(read_model(tmp_path / "m")) == text


def test_a_graph_within_the_bound_keeps_one_storage_per_entry():
    """At the bound itself (four entries of 1 GiB) and in the committed models, storage_id is the entry index,
    though reuse would need less; the committed symbols are written again byte for byte."""
    read, sids, size = written_plan(validate(chain(3)).graph)
    assert sids == [0, 1, 2, 3] and size == BOUND
    for model in sorted(MODELS.glob("*/symbol")):
        text = model.read_text()
        doc = json.loads(text)
        assert doc["attrs"]["storage_id"][1] == list(range(len(doc["attrs"]["shape"][1])))
        assert write_symbol(read_symbol(text)) == text, model


def test_a_graph_whose_reused_plan_passes_the_bound_is_refused():
    """Every op a head: nothing dies, so nothing is reused: five entries of 1 GiB, one problem naming the bound."""
    with pytest.raises(ValidationError) as e:
        validate(chain(4, heads="all"))
    [p] = e.value.problems
    assert p.where == "storage" and "5368709120 bytes" in p.rule and "2^32 = 4294967296" in p.rule, p.rule
