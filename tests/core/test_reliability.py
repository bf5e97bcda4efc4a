"""Reliability: hostile and malformed models give the project's own errors, within time and memory bounds.

The pipelines under test are the converter's: CVM files -> read -> validate -> export to ONNX, and an ONNX file ->
load -> import (-> export again). Inputs are valid models mutated the way a stranger's file can be broken
(truncated, bytes flipped, numbers set to extremes, keys and elements deleted, duplicated or swapped). Every
outcome must be success or a ``CVMError``; anything else is a crash. Each run must stay within ``SECONDS`` (plus
``SECONDS_PER_MB`` of input) of CPU time, and a few times that on the wall clock, and allocate at most ``MEMORY_FACTOR`` times the input's size (plus a fixed allowance
for the libraries' own state).
Crashes found by fuzzing get a regression test at the end. benchmarks/fuzz.py runs the same properties longer.
"""
from __future__ import annotations

import copy
import dataclasses
import errno
import functools
import json
import math
import os
import re
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import fuzz
from support.fuzz import (EXTREMES, Case, Seeds, bounded, files_of, mutate_bytes, mutated_onnx, onnx_seeds,
                          seed_graphs)

import cvm_onnx
from cvm_onnx.app import cli
from cvm_onnx.app.api import import_onnx, write_onnx
from cvm_onnx.converters.from_onnx import from_onnx
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.attrs import AttrSyntaxError, parse_tuple
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import CVMError, FormatError, UnsupportedError, ValidationError
from cvm_onnx.core.format import read_params, read_symbol, write_model, write_params, write_symbol
from cvm_onnx.core.format.onnx_file import onnx_model, onnx_pieces
from cvm_onnx.core.format.params import LIST_MAGIC
from cvm_onnx.core.format.symbol import op_name
from cvm_onnx.core.graph import Entry, Graph, Node, TensorType
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.core.validate import validate

FUZZ = settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))

GRAPHS = seed_graphs()
SEEDS = Seeds({name: files_of(g) for name, g in GRAPHS.items()})
ONNX_SEEDS = onnx_seeds()


@functools.cache
def resnet_seeds(path: Path) -> dict[str, tuple[str, bytes]]:
    return Seeds(resnet=((path / "symbol").read_text(), (path / "params").read_bytes()))


@functools.cache
def resnet_onnx_seeds(path: Path) -> dict[str, bytes]:
    graph = cvm_onnx.load(path).graph
    return Seeds({f"resnet{'/flat' if inline else ''}": to_onnx(graph, inline=inline).SerializeToString()
                  for inline in (False, True)})


def test_seeds_cover_every_op():
    used = {n.op for g in GRAPHS.values() for n in g.nodes if not n.is_variable}
    assert used == set(REGISTRY)


def cvm_to_onnx(symbol: str | bytes, params: bytes) -> onnx.ModelProto:
    """The converter's pipeline (read_model, validate, to_onnx) on file contents."""
    graph = read_symbol(symbol)
    graph.params = read_params(params)
    return to_onnx(validate(graph).graph)


def check_cvm(case: Case) -> onnx.ModelProto | None:
    """The exported model (checked), or None for a CVMError."""
    symbol, params = case.files
    model = bounded(lambda: cvm_to_onnx(symbol, params), len(symbol) + len(params))
    if model is not None:
        onnx.checker.check_model(model)
    return model


def check_onnx(case: Case) -> onnx.ModelProto | None:
    """An .onnx file through the importer (load_onnx, from_onnx with external data from its directory); an
    imported graph must export again. The model exported again, or None for a CVMError."""
    (data,) = case.files
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.onnx"
        path.write_bytes(data)
        return bounded(lambda: to_onnx(import_onnx(path)), len(data))


# -- mutations -----------------------------------------------------------------------------------------------------
NUMBER = re.compile(r"-?\d+")
json_values = st.recursive(st.none() | st.booleans() | st.sampled_from(EXTREMES) | st.sampled_from(["", "{}", "x"]),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                          max_size=2), max_leaves=4)


def places(value: Any, path: str = "") -> list[tuple[Any, Any, str]]:
    """(container, key, path) of every element of a parsed JSON document."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        out.append((value, key, f"{path}.{key}" if path else str(key)))
        out.extend(places(item, out[-1][2]))
    return out


def dumps(value: Any, repeated: dict[int, tuple[str, Any]]) -> str:
    """JSON text; ``repeated[id(obj)] = (key, other)`` writes key twice in obj, ``other`` first (JSON readers keep
    the last)."""
    if isinstance(value, dict):
        members = list(value.items())
        if id(value) in repeated:
            members.insert(0, repeated[id(value)])
        return "{" + ", ".join(f"{json.dumps(k)}: {dumps(v, repeated)}" for k, v in members) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v, repeated) for v in value) + "]"
    return json.dumps(value)


def with_number(draw, text: str) -> str:
    """``text`` with one of its numbers replaced by an extreme (no change if it has none)."""
    found = list(NUMBER.finditer(text))
    if not found:
        return text
    m = draw(st.sampled_from(found))
    return text[:m.start()] + str(draw(st.sampled_from(EXTREMES))) + text[m.end():]


@st.composite
def mutated_symbols(draw, seeds: dict[str, tuple[str, bytes]]) -> Case:
    """A seed's symbol with 1 to 3 structural mutations or a postprocess value (or its text broken), and the seed's
    params."""
    name = draw(st.sampled_from(sorted(seeds)))
    symbol, params = seeds[name]
    steps: list[str] = []
    if draw(st.integers(0, 5)) == 0:
        broken = mutate_bytes(draw, symbol.encode(), steps, "symbol")
        return Case(name, tuple(steps), (broken, params))
    doc = json.loads(symbol)
    repeated: dict[int, tuple[str, Any]] = {}
    for _ in range(draw(st.integers(1, 3))):
        container, key, path = draw(st.sampled_from(places(doc)))
        value = container[key]
        kind = draw(st.sampled_from(["delete", "duplicate", "extreme", "number in text", "swap", "retype",
                                     "postprocess"]))
        if kind == "postprocess":  # the runtime's free-form string, which no seed has
            container, key, path = doc, "postprocess", "postprocess"
            doc[key] = draw(st.sampled_from(["", "argmax", "detection", "x" * 70000, "\t\r\n\\\"", "é"])
                            | json_values)
        elif kind == "delete":
            del container[key]
        elif kind == "duplicate" and isinstance(container, list):
            container.insert(key, copy.deepcopy(value))
        elif kind == "duplicate":
            repeated[id(container)] = (key, draw(st.sampled_from([copy.deepcopy(value), *EXTREMES[:3]])))
        elif kind == "number in text" and isinstance(value, str):
            container[key] = with_number(draw, value)
        elif kind == "swap" and isinstance(container, list):
            j = draw(st.integers(0, len(container) - 1))
            container[key], container[j] = container[j], value
            kind = f"swap with {j}"
        elif kind == "retype":
            container[key] = draw(json_values)
        else:
            container[key] = draw(st.sampled_from(EXTREMES))
        steps.append(f"{kind} {path}" + (f" = {container[key]!r:.60}" if kind in ("extreme", "retype", "postprocess",
                                                                                   "number in text") else ""))
    return Case(name, tuple(steps), (dumps(doc, repeated), params))


attr_texts = st.sampled_from(EXTREMES).map(str) | st.lists(
    st.sampled_from(EXTREMES) | st.integers(-3, 9), max_size=7).map(lambda t: "(" + ", ".join(map(str, t)) + ")") \
    | st.sampled_from(["None", "True", "false", "", "x", "[]", "(,)", "(1, 2]", "1L", " 3 ", "NCHW", "int64", "9" * 30])


@st.composite
def mutated_attributes(draw, seeds: dict[str, tuple[str, bytes]]) -> Case:
    """A seed whose op nodes' attributes are set (to odd or extreme values), deleted or added."""
    name = draw(st.sampled_from(sorted(seeds)))
    symbol, params = seeds[name]
    doc = json.loads(symbol)
    texts = doc["attrs"]["op_attrs"][1]
    ops = [i for i, node in enumerate(doc["nodes"]) if node["op"] != "null"]
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.sampled_from(ops))
        attrs = json.loads(texts[i])
        op = REGISTRY[op_name(doc["nodes"][i]["attrs"]["func_name"])]
        attr = draw(st.sampled_from([a.name for a in op.attrs] + ["bogus", "__hidden__"]))
        if attr in attrs and draw(st.booleans()):
            del attrs[attr]
            steps.append(f"delete {doc['nodes'][i]['name']}.{attr}")
        else:
            attrs[attr] = draw(attr_texts)
            steps.append(f"{doc['nodes'][i]['name']}.{attr} = {attrs[attr]!r:.40}")
        texts[i] = json.dumps(attrs)
    return Case(name, tuple(steps), (json.dumps(doc), params))


def array_bytes(params: bytes) -> tuple[list[str], list[bytes]]:
    """The names and the encoded arrays (header, shape, size, data) of a params file written by write_params."""
    names, arrays = [], []
    (count,) = struct.unpack_from("<Q", params, 16)
    off = 24
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", params, off)
        names.append(params[off + 8:off + 8 + n].decode())
        off += 8 + n
    off += 8
    for _ in range(count):
        (ndim,) = struct.unpack_from("<i", params, off + 24)
        (nbytes,) = struct.unpack_from("<q", params, off + 32 + 8 * ndim)
        end = off + 40 + 8 * ndim + nbytes
        arrays.append(params[off:end])
        off = end
    return names, arrays


def params_file(names: list[str], arrays: list[bytes]) -> bytes:
    head = struct.pack("<QQQ", LIST_MAGIC, 0, len(names))
    head += b"".join(struct.pack("<Q", len(n.encode())) + n.encode() for n in names)
    return head + struct.pack("<Q", len(arrays)) + b"".join(arrays)


@st.composite
def mutated_params(draw, seeds: dict[str, tuple[str, bytes]]) -> Case:
    """A seed's params with arrays deleted, duplicated, swapped or renamed, a field set to an extreme, values set to
    extremes, or the bytes broken."""
    name = draw(st.sampled_from(sorted(k for k in seeds if len(seeds[k][1]) > 32)))
    symbol, params = seeds[name]
    names, arrays = array_bytes(params)
    i, j = draw(st.integers(0, len(names) - 1)), draw(st.integers(0, len(names) - 1))
    kind = draw(st.sampled_from(["delete", "duplicate", "swap", "rename", "field", "values", "bytes"]))
    steps = [f"{kind} {names[i]!r}"]
    if kind == "delete":
        which = draw(st.sampled_from(["name", "array", "both"]))
        steps[0] += f" ({which})"
        if which != "array":
            names.pop(i)
        if which != "name":
            arrays.pop(i)
    elif kind == "duplicate":
        names.append(names[i] if draw(st.booleans()) else "extra")
        arrays.append(arrays[j])
        steps[0] += f" as {names[-1]!r} with the array of {j}"
    elif kind == "swap":
        arrays[i], arrays[j] = arrays[j], arrays[i]
        steps[0] += f" with {j}"
    elif kind == "rename":
        names[i] = draw(st.sampled_from([names[j], "", "data", "x" * 300]))
        steps[0] += f" to {names[i]!r:.20}"
    elif kind == "values":
        values = read_params(params)
        a = values[names[i]].astype(np.int64)
        k, v = draw(st.integers(0, a.size - 1)), draw(st.sampled_from(EXTREMES[:22]))
        a.flat[k] = v
        values[names[i]] = a.astype(np.int32)
        steps[0] += f" value {k} = {v}"
        return Case(name, tuple(steps), (symbol, write_params(values)))
    data = params_file(names, arrays)
    if kind == "field":
        fmt = draw(st.sampled_from(["<q", "<Q", "<i", "<I", "<H", "<B"]))
        out = bytearray(data)
        value = draw(st.sampled_from(EXTREMES))
        offset = draw(st.integers(0, len(out) - struct.calcsize(fmt)))
        try:
            struct.pack_into(fmt, out, offset, value)
            steps[0] = f"field {fmt} at byte {offset} = {value}"
        except struct.error:
            steps[0] = "unchanged"  # the extreme does not fit this field's type
        data = bytes(out)
    elif kind == "bytes":
        steps = []
        data = mutate_bytes(draw, data, steps, "params")
    return Case(name, tuple(steps), (symbol, data))


# -- fuzzing ---------------------------------------------------------------------------------------------------------
def test_seeds_pass_both_pipelines():
    for name, files in SEEDS.items():
        assert check_cvm(Case(name, (), files)) is not None
    for name, data in ONNX_SEEDS.items():
        assert check_onnx(Case(name, (), (data,))) is not None


@FUZZ
@given(mutated_symbols(SEEDS))
def test_fuzzed_symbols(case):
    check_cvm(case)


@FUZZ
@given(mutated_attributes(SEEDS))
def test_fuzzed_attributes(case):
    check_cvm(case)


@FUZZ
@given(mutated_params(SEEDS))
def test_fuzzed_params(case):
    check_cvm(case)


@FUZZ
@given(mutated_onnx(ONNX_SEEDS))
def test_fuzzed_onnx(case):
    check_onnx(case)


@settings(FUZZ, max_examples=8)
@given(st.data())
def test_fuzzed_resnet(resnet_dir, data):
    seeds = resnet_seeds(resnet_dir)
    check_cvm(data.draw(mutated_symbols(seeds) | mutated_attributes(seeds) | mutated_params(seeds)))


@settings(FUZZ, max_examples=4)
@given(st.data())
def test_fuzzed_resnet_onnx(resnet_dir, data):
    check_onnx(data.draw(mutated_onnx(resnet_onnx_seeds(resnet_dir))))


def test_the_time_bound_counts_work_and_catches_a_hang(monkeypatch):
    """The bound is on CPU time (other jobs on the cores do not count) with a wall-clock backstop for a run that
    waits without working."""
    monkeypatch.setattr(fuzz, "SECONDS", 0.05)

    def busy():
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass

    with pytest.raises(AssertionError, match="of CPU"):
        bounded(busy, 0)
    with pytest.raises(AssertionError, match=r"took \S+ s for 0 bytes"):
        bounded(lambda: time.sleep(0.4), 0)
    assert bounded(lambda: time.sleep(0.1), 0) is None  # waiting within the backstop is not work


# -- validation reports every problem at once ----------------------------------------------------------------------
def many_problems(late: bool = True) -> Graph:
    """One broken rule per branch, each branch fed by valid nodes (a node after a failed input is not checked)."""

    def var(name, shape, p=8):
        return Node(name, "null", outputs=(TensorType(shape, p),))

    def op(name, op, inputs, attrs, shape):
        return Node(name, op, tuple(Entry(i) for i in inputs), attrs, (TensorType(shape),))

    conv = {"channels": "2", "kernel_size": "(3, 3)", "padding": "(1, 1)", "use_bias": "False"}
    nodes = [var("data", (1, 2, 4, 4)), var("w", (2, 2, 3, 3)), var("wide", (1, 2, 4, 4), 31),
             var("missing", (2,)), var("w_ok", (2, 2, 3, 3)),
             op("softmax_0", "softmax", [0], {}, (1, 2, 4, 4)),
             op("relu_0", "relu", [0], {"alpha": "1"}, (1, 2, 4, 4)),
             op("shift_0", "cvm_right_shift", [0], {"precision": "8", "shift_bit": "0"}, (1, 2, 4, 4)),
             op("flatten_0", "flatten", [0], {}, (1, 30)),
             op("mul_0", "broadcast_mul", [2, 2], {}, (1, 2, 4, 4)),
             op("conv_0", "conv2d", [2, 4], conv, (1, 2, 4, 4)),
             op("conv_1", "conv2d", [0, 4], conv, (1, 2, 4, 4))]
    if late:
        nodes.append(op("late_0", "relu", [len(nodes) + 1], {}, (1, 2, 4, 4)))
        nodes.append(op("relu_1", "relu", [0], {}, (1, 2, 4, 4)))
    params = {"w": np.full((2, 2, 3, 3), 200, np.int32), "wide": np.full((1, 2, 4, 4), 1 - (1 << 30), np.int32),
              "w_ok": np.ones((2, 2, 3, 3), np.int8), "extra": np.zeros(1, np.int8)}
    return Graph(nodes, [Entry(i) for i in range(5, len(nodes))], params)


EXPECTED_PROBLEMS = [
    ("w", "param value 200 exceeds precision 8"),
    ("missing", "param missing from params"),
    ("softmax_0", "unknown op 'softmax'"),
    ("relu_0", "relu: unknown attribute 'alpha'"),
    ("shift_0", "cvm_right_shift: attribute shift_bit='0': must lie in [1, 32]"),
    ("flatten_0", "flatten: shape in the graph (1, 30) differs from the inferred (1, 32)"),
    ("mul_0", "broadcast_mul: output 0 precision 62 must lie in [1, 32]"),
    ("conv_0", "conv2d: conv2d data precision 31 must be <= 8"),
    ("extra", "param has no variable of that name in the graph"),
]


def test_validation_reports_every_problem_naming_node_and_rule():
    with pytest.raises(ValidationError) as info:
        validate(many_problems())
    problems = info.value.problems
    expected = EXPECTED_PROBLEMS + [("late_0", "input node 13 does not come before node 12 (nodes must be in "
                                               "topological order)")]
    assert len(problems) == len(expected)
    for where, rule in expected:
        assert any(p.where == where and rule in p.rule for p in problems), (where, rule, problems)


def test_cli_validate_prints_every_problem_and_exits_3(tmp_path, capsys):
    """The file reader refuses non-topological order itself (a format error), so the files carry the rest."""
    graph = many_problems(late=False)
    (tmp_path / "symbol").write_text(write_symbol(graph))
    (tmp_path / "params").write_bytes(write_params(graph.params))
    assert cli.main(["validate", str(tmp_path)]) == 3
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == len(EXPECTED_PROBLEMS)
    for where, rule in EXPECTED_PROBLEMS:
        assert f"invalid model: {where}: " in err and rule in err
    assert all(line.startswith("invalid model: ") for line in lines)


# -- determinism and atomic output ---------------------------------------------------------------------------------
HASHES = """
import hashlib, sys
from pathlib import Path
from cvm_onnx.app import api
out = Path(sys.argv[1])
for i, model in enumerate(sys.argv[2:]):
    for inline in (False, True):
        api.convert(model, out / f"{i}{inline}.onnx", inline=inline)
    api.convert(out / f"{i}False.onnx", out / f"{i}back")
for path in sorted(p for p in out.rglob("*") if p.is_file()):
    print(path.relative_to(out), hashlib.sha256(path.read_bytes()).hexdigest())
"""


def test_conversion_is_deterministic_across_processes(resnet_dir, tmp_path):
    """The same model converted (CVM -> ONNX, both forms, and back) in processes with different hash seeds gives
    identical bytes, and the same as in this process."""
    models = []
    for name, graph in GRAPHS.items():
        write_model(graph, tmp_path / "models" / name)
        models.append(str(tmp_path / "models" / name))
    models.append(str(resnet_dir))
    outputs = []
    for seed in ("0", "4242"):
        (tmp_path / seed).mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", HASHES, str(tmp_path / seed), *models], env=env,
                              cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 4 * len(models)
    for i, model in enumerate(models):
        graph, symbol = cvm_onnx.load(model).graph, (Path(model) / "symbol").read_text()
        assert b"".join(onnx_pieces(to_onnx(graph, symbol=symbol))) == (tmp_path / "0" / f"{i}False.onnx").read_bytes()


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_failed_conversions_write_nothing(tmp_path):
    graph = many_problems(late=False)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "symbol").write_text(write_symbol(graph))
    (tmp_path / "bad" / "params").write_bytes(write_params(graph.params))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValidationError):
        cvm_onnx.convert(tmp_path / "bad", out / "m.onnx")
    assert tree(out) == {}
    (out / "m.onnx").write_bytes(b"old")
    with pytest.raises(ValidationError):
        cvm_onnx.convert(tmp_path / "bad", out / "m.onnx")
    assert tree(out) == {"m.onnx": b"old"}
    model = to_onnx(GRAPHS["cnn"])
    model.graph.node[-1].op_type = "Sin"  # ONNX -> CVM: refused
    write_onnx(model, tmp_path / "sin.onnx")
    with pytest.raises(FormatError, match="cvm_clip_12: cvm has no op Sin"):
        cvm_onnx.convert(tmp_path / "sin.onnx", out / "cvm")
    assert tree(out) == {"m.onnx": b"old"}


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")])
@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_interrupted_writes_leave_the_old_files(tmp_path, monkeypatch, failure, step):
    """An error or an interruption while writing leaves each output as it was, and no temporary file."""
    write_onnx(to_onnx(GRAPHS["cnn"]), tmp_path / "m.onnx")
    write_model(GRAPHS["cnn"], tmp_path / "cvm")
    before = tree(tmp_path)

    def fail(*args):
        raise failure

    monkeypatch.setattr(os, step, fail)
    expected = KeyboardInterrupt if isinstance(failure, KeyboardInterrupt) else FormatError
    with pytest.raises(expected):
        write_onnx(to_onnx(GRAPHS["transform"]), tmp_path / "m.onnx")
    with pytest.raises(expected):
        write_model(GRAPHS["transform"], tmp_path / "cvm")
    monkeypatch.undo()
    assert tree(tmp_path) == before


def test_external_data_outside_the_model_directory_is_refused(tmp_path):
    """A tensor may not read a file beside or above its model's directory, even one that exists."""
    (tmp_path / "secret.bin").write_bytes(bytes(64))
    (tmp_path / "model").mkdir()
    for location in ("../secret.bin", str(tmp_path / "secret.bin")):
        model = to_onnx(GRAPHS["cnn"])
        t = model.graph.initializer[0]
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        t.external_data.add(key="location", value=location)
        write_onnx(model, tmp_path / "model" / "m.onnx")
        with pytest.raises(FormatError, match="external data location"):
            import_onnx(tmp_path / "model" / "m.onnx")


# -- crashes found by fuzzing ----------------------------------------------------------------------------------------
def test_empty_tuple_attribute_is_a_validation_error():
    """An empty string for a tuple attribute was indexed before being checked (IndexError)."""
    with pytest.raises(AttrSyntaxError):
        parse_tuple("")
    b = GraphBuilder()
    x = b.input("data", (1, 1, 4, 4), 8)
    b.op("max_pool2d", x, name="pool", pool_size="")
    with pytest.raises(ValidationError) as info:
        b.build(x)
    assert [str(p) for p in info.value.problems] == ["pool: max_pool2d: attribute pool_size='': '' is not an integer"]


def vision_graph(**attrs):
    b = GraphBuilder()
    counts, rows = b.op("get_valid_counts", b.input("data", (1, 5, 6), 8), name="gvc", **attrs)
    return b.build(counts, rows)


@pytest.mark.parametrize("value", [str(1 << 31), str(-(1 << 31) - 1), str(1 << 64), "9" * 5000, 1 << 31],
                         ids=["2^31", "-2^31-1", "2^64", "5000 digits", "typed 2^31"])
def test_int_attributes_beyond_int32_are_validation_errors(value):
    """The runtime reads int attributes into an int32 (istream >> int fails beyond). 2^64 passed validation and
    crashed the exporter (ValueError from onnx.helper); 5000 digits crashed Python's int() (ValueError)."""
    with pytest.raises(ValidationError) as info:
        vision_graph(score_threshold=value)
    [problem] = info.value.problems
    assert problem.where == "gvc" and "score_threshold" in problem.rule and "int32" in problem.rule


@pytest.mark.parametrize("inline", [False, True])
def test_int_attributes_at_the_int32_edges_export(inline):
    """score_threshold at both int32 ends is written as given and reads back the same from the export."""
    for value in ((1 << 31) - 1, -(1 << 31)):
        model = to_onnx(vision_graph(score_threshold=str(value)), inline=inline)
        written = [a.i for n in model.graph.node for a in n.attribute if a.name == "score_threshold"]
        assert written == [value]
        [back] = [n for n in from_onnx(model).nodes if n.op == "get_valid_counts"]
        assert REGISTRY["get_valid_counts"].bind(back.attrs).score_threshold == value


def test_tuple_items_beyond_int64_are_syntax_errors():
    """Tuple items are read into int64 (TShape); 5000 digits crashed Python's int() (ValueError)."""
    assert parse_tuple(f"({(1 << 63) - 1}, {-(1 << 63)})") == ((1 << 63) - 1, -(1 << 63))
    for text in (f"({1 << 63},)", f"[{-(1 << 63) - 1}]", "9" * 5000, f"(1, {'9' * 5000})"):
        with pytest.raises(AttrSyntaxError, match="int64"):
            parse_tuple(text)


def test_write_onnx_failures_are_format_errors_and_leave_nothing(tmp_path):
    """A missing directory or a directory in the way gave FileNotFoundError / IsADirectoryError (internal errors)."""
    model = to_onnx(vision_graph())
    (tmp_path / "taken.onnx").mkdir()
    for target in (tmp_path / "missing" / "m.onnx", tmp_path / "taken.onnx"):
        with pytest.raises(FormatError, match="cannot write the model"):
            write_onnx(model, target)
    assert [p.name for p in tmp_path.iterdir()] == ["taken.onnx"] and not any((tmp_path / "taken.onnx").iterdir())


def test_write_onnx_gives_new_files_the_usual_mode(tmp_path):
    """Output was left with mkstemp's 0600; a new file gets 0644, a replaced file keeps its mode."""
    model = to_onnx(vision_graph())
    write_onnx(model, tmp_path / "m.onnx")
    assert stat.S_IMODE((tmp_path / "m.onnx").stat().st_mode) == 0o644
    (tmp_path / "m.onnx").chmod(0o640)
    write_onnx(model, tmp_path / "m.onnx")
    assert stat.S_IMODE((tmp_path / "m.onnx").stat().st_mode) == 0o640


def failing_fsync(monkeypatch, nth: int) -> None:
    """Make the ``nth`` os.fsync fail as a full disk does."""
    calls, real = [], os.fsync

    def fsync(fd):
        calls.append(fd)
        if len(calls) == nth:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_write_model_failing_on_params_keeps_both_old_files(tmp_path, monkeypatch):
    """write_model replaced the symbol before writing the params: a failure there left a new symbol with the old
    params. A fresh directory is not left behind either."""
    write_model(vision_graph(), tmp_path / "m")
    old = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    failing_fsync(monkeypatch, 2)
    with pytest.raises(FormatError, match="No space left on device"):
        write_model(vision_graph(score_threshold=3), tmp_path / "m")
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == old
    failing_fsync(monkeypatch, 1)
    with pytest.raises(FormatError):
        write_model(vision_graph(), tmp_path / "new")
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def import_file(tmp_path, data: bytes):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    return import_onnx(path)


@pytest.mark.parametrize("dtype", [0, 8, 14, 17, 22, -1, 127])
def test_tensors_of_unreadable_types_are_format_errors_or_unsupported(tmp_path, dtype):
    """UNDEFINED, STRING, COMPLEX64, FLOAT8E4M3FN, INT4 and unknown values crashed numpy_helper.to_array (KeyError,
    TypeError, ValueError) when a Constant of that type was read. A valid ONNX type without a CVM form (string,
    complex, float8, int4: onnxruntime's own QInt4 weights) is unsupported; UNDEFINED or no type at all, a broken
    file."""
    model = to_onnx(vision_graph())
    assert model.graph.node[0].op_type == "Constant"
    model.graph.node[0].attribute[0].t.data_type = dtype
    with pytest.raises(UnsupportedError if dtype in (8, 14, 17, 22) else FormatError, match="data type"):
        import_file(tmp_path, model.SerializeToString())
    model.graph.input[0].type.tensor_type.elem_type = dtype  # its name in a message crashed too (ValueError)
    model.graph.node[0].attribute[0].t.data_type = onnx.TensorProto.INT32
    with pytest.raises(CVMError, match="data: (input of non-integer type|declares element type)"):
        import_file(tmp_path, model.SerializeToString())


def test_strings_that_are_not_utf8_are_format_errors(tmp_path):
    """Protobuf hands such strings over as bytes: TypeErrors all over the importer, or the exporter after it."""
    data = to_onnx(vision_graph()).SerializeToString()
    assert data.count(b"gvc") > 2
    with pytest.raises(FormatError, match="not UTF-8") as info:
        import_file(tmp_path, data.replace(b"gvc", b"g\xffc"))
    assert all("not UTF-8" in p.rule for p in info.value.problems)


def int_model(nodes, outputs=("y",), opset: int = 21) -> bytes:
    vi = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.INT32, [1, 4]) for n in ("data", *outputs)]
    graph = onnx.helper.make_graph(nodes, "g", vi[:1], vi[1:])
    return onnx_model(graph, opset).SerializeToString()


@pytest.mark.parametrize("node, problem", [
    (onnx.helper.make_node("Clip", ["data", "", "", "data"], ["y"], name="n"), "n: Clip takes 1 to 3 input(s), has 4"),
    (onnx.helper.make_node("Conv", ["data"], ["y"], name="n"), "n: Conv takes 2 to 3 input(s), has 1"),
    (onnx.helper.make_node("Relu", [], ["y"], name="n"), "n: Relu takes 1 input(s), has 0"),
    (onnx.helper.make_node("Relu", ["data"], ["y", "z"], name="n"), "n: Relu gives 1 output(s), has 2"),
    (onnx.helper.make_node("Clip", ["", "data"], ["y"], name="n"), "n: Clip: input 0 (input) is required, but empty"),
])
def test_nodes_with_inputs_their_op_does_not_take_are_format_errors(tmp_path, node, problem):
    """Import rules were called with the node's inputs as they came: TypeError (Clip with 4 inputs, Conv with 1) or
    AttributeError (Clip without its required input)."""
    with pytest.raises(FormatError) as info:
        import_file(tmp_path, int_model([node]))
    assert [str(p) for p in info.value.problems] == [problem]


#: The input as float, for the ops whose schema takes float bounds or values (Clip, Pad) with them.
AS_FLOAT = onnx.helper.make_node("Cast", ["data"], ["f"], to=onnx.TensorProto.FLOAT)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_constant_bounds_are_refused(tmp_path, value):
    """int(nan) and int(inf) in the check that a constant scalar is an integer raised ValueError/OverflowError."""
    nodes = [onnx.helper.make_node("Constant", [], ["lo"], value=onnx.helper.make_tensor("lo", 1, [], [value])),
             AS_FLOAT, onnx.helper.make_node("Clip", ["f", "lo"], ["y"], name="clip")]
    with pytest.raises(UnsupportedError, match=re.escape(f"clip (Clip): Clip min = {value} is not an integer")):
        import_file(tmp_path, int_model(nodes))


@pytest.mark.parametrize("version", [(1 << 63) - 1, -(1 << 63), 0])
def test_absurd_opset_versions_are_not_a_crash(tmp_path, version):
    """The schema lookup of the arity check got the version as a C int (TypeError beyond it)."""
    model = onnx.load_from_string(int_model([onnx.helper.make_node("Relu", ["data"], ["y"], name="relu")]))
    model.opset_import[0].version = version
    with pytest.raises(FormatError, match=re.escape(f"model: ai.onnx opset {version} is not one the installed onnx "
                                                    f"and onnxruntime read")):
        import_file(tmp_path, model.SerializeToString())


@pytest.mark.parametrize("shape", [[3], [1], [2, 5], []])
def test_matmul_operands_that_do_not_match_are_refused(tmp_path, shape):
    """The MatMul rule reshaped the right operand to (k, 1) with k taken from the left one (ValueError), or
    indexed the shape of a scalar (IndexError)."""
    b = onnx.helper.make_tensor("b", onnx.TensorProto.INT32, shape, [1] * math.prod(shape))
    nodes = [onnx.helper.make_node("Constant", [], ["b"], value=b),
             onnx.helper.make_node("MatMul", ["data", "b"], ["y"], name="mm")]
    with pytest.raises(UnsupportedError, match=re.escape(f"mm (MatMul): MatMul operands of shapes (1, 4) and "
                                                         f"{tuple(shape)} do not match")):
        import_file(tmp_path, int_model(nodes))


def test_an_unread_declared_param_that_cannot_be_one_is_refused(tmp_path):
    """Params that no node reads are added last, outside the rules' error handling: the importer's internal
    Refuse escaped (found by fuzzing: a flat-form marker changed, so its weight was read by nothing)."""
    model = onnx.load_from_string(int_model([onnx.helper.make_node("Relu", ["data"], ["y"])]))
    model.graph.initializer.append(onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [0.5, 1.0]))
    info = model.graph.value_info.add()
    info.CopyFrom(onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [2]))
    info.metadata_props.add(key="cvm.precision", value="8")
    with pytest.raises(UnsupportedError) as error:
        import_file(tmp_path, model.SerializeToString())
    assert [str(p) for p in error.value.problems] == ["w: constant w holds non-integer values"]


@pytest.mark.parametrize("shape, attrs, rule", [
    ([4], {}, "Gemm operands of shapes (1, 4) and (4,): both must be matrices"),
    ([2, 4, 1], {}, "Gemm operands of shapes (1, 4) and (2, 4, 1): both must be matrices"),
    ([4, 2], {"alpha": float("nan")}, "Gemm alpha=nan, beta=1.0: only integer factors have an exact CVM form"),
])
def test_gemm_operands_that_do_not_fit_are_refused(tmp_path, shape, attrs, rule):
    """The Gemm rule transposed operands of any rank (ValueError from numpy) and took int() of its factors."""
    b = onnx.helper.make_tensor("b", onnx.TensorProto.INT32, shape, [1] * math.prod(shape))
    nodes = [onnx.helper.make_node("Constant", [], ["b"], value=b),
             onnx.helper.make_node("Gemm", ["data", "b"], ["y"], name="gemm", **attrs)]
    with pytest.raises(UnsupportedError) as info:
        import_file(tmp_path, int_model(nodes))
    assert [str(p) for p in info.value.problems] == [f"gemm (Gemm): {rule}"]


def pad_with(value: float) -> list:
    return [onnx.helper.make_node("Constant", [], ["v"], value=onnx.helper.make_tensor("v", 1, [], [value])),
            onnx.helper.make_node("Constant", [], ["p"], value=onnx.helper.make_tensor("p", 7, [4], [0, 1, 0, 1])),
            AS_FLOAT, onnx.helper.make_node("Pad", ["f", "p", "v"], ["y"], name="n")]


@pytest.mark.parametrize("nodes, opset, problem", [
    ([AS_FLOAT, onnx.helper.make_node("Clip", ["f"], ["y"], name="n", min=float("nan"))], 6,
     "n (Clip): Clip bounds nan, None are not integers"),
    ([AS_FLOAT, onnx.helper.make_node("Pad", ["f"], ["y"], name="n", pads=[0, 1, 0, 1], value=float("nan"))], 6,
     "n (Pad): Pad value nan is not an integer"),
    ([AS_FLOAT, onnx.helper.make_node("Pad", ["f"], ["y"], name="n", pads=[0, 1, 0, 1], value=float("inf"))], 6,
     "n (Pad): Pad value inf is not an integer"),
    (pad_with(float("nan")), 13, "n (Pad): Pad constant_value must hold integers"),
    (pad_with(float("inf")), 13, "n (Pad): Pad constant_value must hold integers"),
    (pad_with(0.5), 13, "n (Pad): Pad constant_value must hold integers"),
], ids=["Clip-nan", "Pad-nan", "Pad-inf", "constant-nan", "constant-inf", "constant-0.5"])
def test_non_integer_float_attributes_and_constants_are_refused(tmp_path, nodes, opset, problem):
    """int() of nan or inf raised in Clip's and Pad's attribute checks (opset < 11) and in reading constant integer
    inputs, where 0.5 was truncated silently (a Pad constant_value of 0.5 padded with 0)."""
    with pytest.raises(UnsupportedError) as info:
        import_file(tmp_path, int_model(nodes, opset=opset))
    assert [str(p) for p in info.value.problems] == [problem]


@pytest.mark.parametrize("inline", [False, True])
def test_op_nodes_of_one_name_export_as_tensors_of_their_own(inline):
    """Op nodes named alike (the runtime takes any names), named as the input or its clamped entry, or not named:
    each output gets a tensor name of its own, the export passes onnx's checker and equals the reference executor
    (before: 'op0 has been used as output names multiple times', "Field 'name' of 'value_info' is required to be
    non-empty": the fuzzer's storage seeds with a node renamed)."""
    from cvm_onnx.runtime.verify import verify

    b = GraphBuilder()
    x = b.input("data", (2, 3), 8)
    a = b.op("relu", x, name="op0")
    y = b.op("negative", a, name="op0")
    z = b.op("abs", b.op("negative", y, name="data"), name="data:clamped")
    e = b.op("relu", z)
    nodes = list(b.nodes)
    nodes[-1] = dataclasses.replace(nodes[-1], name="")
    graph = validate(Graph(nodes, [y, z, a, e], {})).graph
    assert [n.name for n in graph.nodes] == ["data", "op0", "op0", "data", "data:clamped", ""]
    onnx.checker.check_model(to_onnx(graph, inline=inline))
    assert verify(graph, seeds=2).exact
