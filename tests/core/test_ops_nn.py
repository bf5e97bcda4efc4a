"""conv2d, dense, max_pool2d, upsampling, relu: kernels against loop oracles written from the runtime's formulas,
shape and precision inference, and the load-time rules."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import INT32_MAX, INT32_MIN, bound
from support.oracles import errors_of, make, wrap

from cvm_onnx.core.ops import REGISTRY, OpRuleError

FAST = settings(max_examples=60, deadline=None)


def run(op, a, *xs):
    xs = [np.asarray(x, np.int32) for x in xs]
    outs = op.run(a, xs)
    assert all(o.dtype == np.int32 for o in outs)
    assert op.infer_shapes(a, [x.shape for x in xs]) == [o.shape for o in outs]
    return outs[0]


# -- conv2d -------------------------------------------------------------------------------------------------
def conv_oracle(x, w, b, strides, padding, dilation, groups):
    """The FORMAL loop: y[n,oc,oh,ow] = sum x[n, oc/(OC/g)*(C/g)+ic, oh*sh+fh*dh-ph, ow*sw+fw*dw-pw] * w + b."""
    n_, c, h, wd = x.shape
    oc_, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = strides, padding, dilation
    oh_ = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow_ = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n_, oc_, oh_, ow_), np.int64)
    for n in range(n_):
        for oc in range(oc_):
            for oh in range(oh_):
                for ow in range(ow_):
                    s = 0
                    for ic in range(cg):
                        for fh in range(kh):
                            for fw in range(kw):
                                ih, iw = oh * sh + fh * dh - ph, ow * sw + fw * dw - pw
                                if 0 <= ih < h and 0 <= iw < wd:
                                    s += int(x[n, oc // (oc_ // groups) * cg + ic, ih, iw]) * int(w[oc, ic, fh, fw])
                    y[n, oc, oh, ow] = wrap(s + (int(b[oc]) if b is not None else 0), 32)
    return y


@st.composite
def conv_cases(draw, values=st.integers(-127, 127)):
    g = draw(st.integers(1, 3))
    cg, ocg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 6))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 6))
    n = draw(st.integers(1, 2))
    use_bias = draw(st.booleans())
    arr = lambda shape: np.array(draw(st.lists(values, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
                                 ).reshape(shape)
    x, wt = arr((n, g * cg, h, w)), arr((g * ocg, cg, kh, kw))
    b = np.array(draw(st.lists(st.integers(-(1 << 20), 1 << 20), min_size=g * ocg, max_size=g * ocg))) \
        if use_bias else None
    attrs = dict(channels=g * ocg, kernel_size=(kh, kw), strides=(sh, sw), padding=(ph, pw), dilation=(dh, dw),
                 groups=g, use_bias=use_bias)
    return attrs, x, wt, b


@FAST
@given(conv_cases())
def test_conv2d_matches_loop_oracle(case):
    attrs, x, w, b = case
    op, a = make("conv2d", **attrs)
    xs = (x, w) if b is None else (x, w, b)
    expect = conv_oracle(x, w, b, a.strides, a.padding, a.dilation, a.groups)
    assert np.array_equal(run(op, a, *xs), expect)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1 << 15, 1 << 31]).flatmap(lambda m: conv_cases(values=st.integers(-m, m - 1))))
def test_conv2d_outside_precision_wraps_like_int32(case):
    """Inputs beyond 8 bits (float64 or int64 products): the result still equals int32 accumulation."""
    attrs, x, w, b = case
    op, a = make("conv2d", **attrs)
    xs = (x, w) if b is None else (x, w, b)
    assert np.array_equal(run(op, a, *xs), conv_oracle(x, w, b, a.strides, a.padding, a.dilation, a.groups))


@FAST
@given(conv_cases(), st.integers(1, 200))
def test_conv2d_in_blocks_matches_loop_oracle(case, cols):
    """im2col, weights and products held to ``cols`` values at a time (nn.COLS): blocks of samples, of output rows
    (one row each at the least) and of output channels."""
    from cvm_onnx.core.ops import nn

    attrs, x, w, b = case
    op, a = make("conv2d", **attrs)
    xs = (x, w) if b is None else (x, w, b)
    saved, nn.COLS = nn.COLS, cols
    try:
        got = run(op, a, *xs)
    finally:
        nn.COLS = saved
    assert np.array_equal(got, conv_oracle(x, w, b, a.strides, a.padding, a.dilation, a.groups))


@settings(max_examples=40, deadline=None)
@given(st.data(), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6), st.integers(1, 4), st.integers(1, 4),
       st.integers(1, 3), st.integers(0, 3), st.integers(1, 2), st.sampled_from([1, 127, 1 << 15, 1 << 31]),
       st.integers(1, 1 << 12), st.integers(0, 2**32 - 1))
def test_conv2d_in_blocks_equals_it_whole(data, g, cg, ocg, kh, kw, s, p, d, m, cols, seed):
    """Larger convolutions than the loop oracle affords, values up to the int32 extremes (float32, float64 and int64
    products): in blocks of at most ``cols`` values (nn.COLS) the same int32 results as in one block."""
    from cvm_onnx.core.ops import nn

    rng = np.random.default_rng(seed)
    h = data.draw(st.integers(max(1, d * (kh - 1) + 1 - 2 * p), 20))
    w = data.draw(st.integers(max(1, d * (kw - 1) + 1 - 2 * p), 20))
    n, use_bias = data.draw(st.integers(1, 3)), data.draw(st.booleans())
    ints = lambda shape, lo, hi: rng.integers(lo, hi, shape, dtype=np.int64)  # noqa: E731
    x, wt = ints((n, g * cg, h, w), -m, m), ints((g * ocg, cg, kh, kw), -m, m)
    for a in (x, wt):  # some of the extremes themselves
        a.reshape(-1)[rng.integers(0, a.size, 3)] = rng.choice([-m, m - 1], 3)
    xs = (x, wt) + ((ints((g * ocg,), INT32_MIN, INT32_MAX + 1),) if use_bias else ())
    op, a = make("conv2d", channels=g * ocg, kernel_size=(kh, kw), strides=(s, s), padding=(p, p),
                 dilation=(d, d), groups=g, use_bias=use_bias)
    saved = nn.COLS
    try:
        nn.COLS = 1 << 40
        whole = run(op, a, *xs)
        nn.COLS = cols
        assert np.array_equal(run(op, a, *xs), whole)
    finally:
        nn.COLS = saved


@st.composite
def lattice_cases(draw, values=st.integers(-255, 255)):
    """A conv2d (stride 1) of an input holding beta[n, c] everywhere but on rows a + P t and columns b + Q u (a
    transposed convolution's input: its values with P - 1 rows and Q - 1 columns of 0 or of an offset between
    them), those drawn too (or none: beta alone)."""
    g, cg, ocg = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    ph, pw = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 7))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 7))
    p, q, n = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    a, b = draw(st.integers(0, p - 1)), draw(st.integers(0, q - 1))
    arr = lambda shape: np.array(draw(st.lists(values, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
                                 ).reshape(shape)  # noqa: E731
    x = np.broadcast_to(arr((n, g * cg, 1, 1)), (n, g * cg, h, w)).copy()
    if draw(st.booleans()):
        x[:, :, a::p, b::q] = arr(x[:, :, a::p, b::q].shape)
    use_bias = draw(st.booleans())
    bias = np.array(draw(st.lists(st.integers(INT32_MIN, INT32_MAX), min_size=g * ocg, max_size=g * ocg))) \
        if use_bias else None
    attrs = dict(channels=g * ocg, kernel_size=(kh, kw), padding=(ph, pw), dilation=(dh, dw), groups=g,
                 use_bias=use_bias)
    return attrs, x, arr((g * ocg, cg, kh, kw)), bias


@settings(max_examples=120, deadline=None)
@given(st.one_of(lattice_cases(), lattice_cases(values=st.integers(INT32_MIN, INT32_MAX))))
def test_conv2d_on_a_lattice_matches_loop_oracle(case):
    """Inputs on a lattice (``nn._lattice``: the phases of the output, each by the taps meeting the lattice, plus
    the offset's sums over the taps inside the image), of any period, offset, padding, dilation and groups, with
    values up to the int32 extremes: the loop oracle's int32 results."""
    attrs, x, w, b = case
    op, a = make("conv2d", **attrs)
    xs = (x, w) if b is None else (x, w, b)
    assert np.array_equal(run(op, a, *xs), conv_oracle(x, w, b, (1, 1), a.padding, a.dilation, a.groups))


def shifted_sums(x, w, padding):
    """A stride-1 conv2d's int64 sums, tap by tap over the zero-padded input (no groups, no dilation)."""
    (ph, pw), (kh, kw) = padding, w.shape[2:]
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
    return sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j].astype(np.int64))
               for i in range(kh) for j in range(kw))


@pytest.mark.parametrize("offset", [0, 53])
def test_conv2d_of_a_transposed_convolutions_input_takes_a_quarter_of_the_products(monkeypatch, offset):
    """A ConvTranspose's conv2d (stride 2: x - z upsampled, every other row and column 0, then offset by a
    constant as the product's parts are): 1/4 of the products of the dense form (it took them all) and the
    offset's sum per tap and output channel, the same sums."""
    from cvm_onnx.core.ops import nn

    rng = np.random.default_rng(0)
    x = np.zeros((1, 32, 24, 24), np.int64)
    x[:, :, ::2, ::2] = rng.integers(-127, 128, (1, 32, 12, 12))
    x -= offset
    w = rng.integers(-127, 128, (16, 32, 4, 4))
    products, summed = [0], nn.summed
    monkeypatch.setattr(nn, "summed", lambda a, b, terms: products.__setitem__(0, products[0] + a.shape[-2] *
                                                                                a.shape[-1] * b[..., 0, :].size)
                        or summed(a, b, terms))
    op, a = make("conv2d", channels=16, kernel_size=(4, 4), padding=(2, 2), use_bias=False)
    y = run(op, a, x, w)
    assert np.array_equal(y, shifted_sums(x, w, (2, 2)))
    assert products[0] == 16 * 32 * 16 * 25 * 25 // 4 + 16 * 32 * 16, products[0]  # + the offset's, per tap


def test_conv2d_groups_depthwise_and_general():
    rng = np.random.default_rng(0)
    for c, oc, g in ((4, 4, 4), (6, 4, 2), (4, 8, 4), (3, 6, 1)):
        x = rng.integers(-127, 128, (2, c, 5, 5))
        w = rng.integers(-127, 128, (oc, c // g, 3, 3))
        op, a = make("conv2d", channels=oc, kernel_size=(3, 3), padding=(1, 1), groups=g, use_bias=False)
        assert np.array_equal(run(op, a, x, w), conv_oracle(x, w, None, (1, 1), (1, 1), (1, 1), g))


@settings(max_examples=40, deadline=None)
@given(conv_cases(values=st.just(0)), st.integers(1, 8), st.integers(1, 8), st.integers(1, 32),
       st.sampled_from([1, -1]), st.booleans(), st.integers(0, 99))
def test_conv2d_precision_is_a_true_bound(case, p_d, p_w, p_b, sign, aligned, seed):
    """Inputs at the extremes +-(2^(p-1)-1): all signs aligned (the largest sums) or random data signs."""
    attrs, x, w, b = case
    op, a = make("conv2d", **attrs)
    x_sign = sign if aligned else np.random.default_rng(seed).choice([-1, 1], x.shape)
    xs = [np.full(x.shape, bound(p_d)) * x_sign, np.full(w.shape, bound(p_w)) * sign]
    if b is not None:
        xs.append(np.full(b.shape, bound(p_b)) * sign)
    p = op.infer_precisions(a, [p_d, p_w, p_b][:len(xs)], [t.shape for t in xs])[0]
    if p <= 32:  # else validation rejects the node
        assert np.abs(run(op, a, *xs).astype(np.int64)).max() <= bound(p)


def test_conv2d_precision_formula():
    op, a = make("conv2d", channels=16, kernel_size=(3, 3), use_bias=False)
    assert op.infer_precisions(a, [8, 8], [(1, 16, 32, 32), (16, 16, 3, 3)]) == [8 + 8 + 8]  # bits(144) = 8
    op, a = make("conv2d", channels=8, kernel_size=(3, 3), groups=2)
    assert op.infer_precisions(a, [6, 7, 5], [(1, 4, 8, 8), (8, 2, 3, 3), (8,)]) == [6 + 7 + 5 + 1]  # bits(18)=5
    assert op.infer_precisions(a, [6, 7, 30], [(1, 4, 8, 8), (8, 2, 3, 3), (8,)]) == [31]
    for p_d, p_w in ((9, 8), (8, 9)):
        with pytest.raises(OpRuleError, match="precision 9 must be <= 8"):
            op.infer_precisions(a, [p_d, p_w, 8], [(1, 4, 8, 8), (8, 2, 3, 3), (8,)])


def test_conv2d_attributes_and_arity():
    op = REGISTRY["conv2d"]
    a = op.bind(op.parse_attrs({"channels": "8", "kernel_size": "(3, 3)"})[0])
    assert a.as_dict() == dict(channels=8, kernel_size=(3, 3), strides=(1, 1), padding=(0, 0), dilation=(1, 1),
                               groups=1, layout="NCHW", kernel_layout="OIHW", out_layout="__undef__",
                               out_dtype="same", use_bias=True)
    assert op.arity(a) == (3, 3)
    assert op.arity(make("conv2d", channels=8, kernel_size=(3, 3), use_bias="False")[1]) == (2, 2)
    assert "channels is required" in errors_of("conv2d", kernel_size="(3, 3)")
    assert "kernel_size is required" in errors_of("conv2d", channels="8")
    for bad in (dict(kernel_size="(3,)"), dict(strides="(0, 1)"), dict(strides="(1, 4097)"), dict(strides="(1,)"),
                dict(padding="(-1, 0)"), dict(padding="(4097, 0)"), dict(padding="(1, 1, 1, 1)"),
                dict(dilation="(0, 1)"), dict(layout="NHWC"), dict(kernel_layout="HWIO"), dict(out_layout="NHWC"),
                dict(out_dtype="float32"), dict(out_dtype="-1"), dict(bias="1")):
        assert errors_of("conv2d", **{"channels": "8", "kernel_size": "(3, 3)", **bad}), bad
    for ok in (dict(out_layout="NCHW"), dict(out_dtype="int32"), dict(padding="(4096, 0)"), dict(__hidden__="x")):
        assert not errors_of("conv2d", **{"channels": "8", "kernel_size": "(3, 3)", **ok}), ok


def test_conv2d_shape_rules():
    op, a = make("conv2d", channels=8, kernel_size=(3, 3), padding=(1, 1))
    assert op.infer_shapes(a, [(2, 4, 7, 9), (8, 4, 3, 3), (8,)]) == [(2, 8, 7, 9)]
    _, a2 = make("conv2d", channels=8, kernel_size=(3, 3), strides=(2, 3), dilation=(2, 1))
    assert op.infer_shapes(a2, [(1, 4, 9, 10), (8, 4, 3, 3), (8,)]) == [(1, 8, 3, 3)]  # (9-5)/2+1, (10-3)/3+1
    with pytest.raises(OpRuleError, match=r"weight shape \(8, 3, 3, 3\) must be \(channels, C/groups, kh, kw\) = "
                                          r"\(8, 4, 3, 3\)"):
        op.infer_shapes(a, [(2, 4, 7, 9), (8, 3, 3, 3), (8,)])
    with pytest.raises(OpRuleError, match=r"bias shape \(4,\) must be \(channels,\) = \(8,\)"):
        op.infer_shapes(a, [(2, 4, 7, 9), (8, 4, 3, 3), (4,)])
    with pytest.raises(OpRuleError, match="4-D"):
        op.infer_shapes(a, [(4, 7, 9), (8, 4, 3, 3), (8,)])
    _, ag = make("conv2d", channels=8, kernel_size=(3, 3), groups=3)
    with pytest.raises(OpRuleError, match="groups=3"):
        op.infer_shapes(ag, [(1, 6, 7, 7), (8, 2, 3, 3), (8,)])  # 3 does not divide channels=8
    _, ag = make("conv2d", channels=6, kernel_size=(3, 3), groups=0)
    with pytest.raises(OpRuleError, match="groups=0"):
        op.infer_shapes(ag, [(1, 6, 7, 7), (6, 6, 3, 3), (6,)])
    _, ak = make("conv2d", channels=8, kernel_size=(3, 3), dilation=(3, 1), use_bias=False)
    with pytest.raises(OpRuleError, match="dilated kernel"):
        op.infer_shapes(ak, [(1, 4, 6, 6), (8, 4, 3, 3)])  # 7 > 6
    assert op.infer_shapes(ak, [(1, 4, 7, 6), (8, 4, 3, 3)]) == [(1, 8, 1, 4)]


# -- dense --------------------------------------------------------------------------------------------------
def dense_oracle(x, w, b):
    m_, k_ = x.shape
    y = np.zeros((m_, w.shape[0]), np.int64)
    for m in range(m_):
        for n in range(w.shape[0]):
            y[m, n] = wrap(sum(int(x[m, k]) * int(w[n, k]) for k in range(k_)) + (int(b[n]) if b is not None else 0), 32)
    return y


@st.composite
def dense_cases(draw, values=st.integers(-127, 127)):
    m, k, units = draw(st.integers(1, 4)), draw(st.integers(1, 40)), draw(st.integers(1, 5))
    arr = lambda shape, v=values: np.array(draw(st.lists(v, min_size=int(np.prod(shape)),
                                                          max_size=int(np.prod(shape))))).reshape(shape)
    b = arr((units,), st.integers(INT32_MIN // 2, INT32_MAX // 2)) if draw(st.booleans()) else None
    return units, arr((m, k)), arr((units, k)), b


@FAST
@given(dense_cases())
def test_dense_matches_loop_oracle(case):
    units, x, w, b = case
    op, a = make("dense", units=units, use_bias=b is not None)
    assert np.array_equal(run(op, a, *([x, w] + ([b] if b is not None else []))), dense_oracle(x, w, b))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1 << 15, 1 << 31]).flatmap(lambda m: dense_cases(values=st.integers(-m, m - 1))))
def test_dense_outside_precision_wraps_like_int32(case):
    units, x, w, b = case
    op, a = make("dense", units=units, use_bias=b is not None)
    assert np.array_equal(run(op, a, *([x, w] + ([b] if b is not None else []))), dense_oracle(x, w, b))


@FAST
@given(dense_cases(values=st.just(0)), st.integers(1, 8), st.integers(1, 8), st.integers(1, 32),
       st.sampled_from([1, -1]))
def test_dense_precision_is_a_true_bound(case, p_d, p_w, p_b, sign):
    units, x, w, b = case
    op, a = make("dense", units=units, use_bias=b is not None)
    xs = [np.full(x.shape, bound(p_d)) * sign, np.full(w.shape, bound(p_w))]
    if b is not None:
        xs.append(np.full(b.shape, bound(p_b)) * sign)
    p = op.infer_precisions(a, [p_d, p_w, p_b][:len(xs)], [t.shape for t in xs])[0]
    if p <= 32:
        assert np.abs(run(op, a, *xs).astype(np.int64)).max() <= bound(p)


@pytest.mark.parametrize("k", [1040, 1041, 3001])
def test_dense_exact_past_the_float32_bound(k):
    """127*127*k passes 2^24 at k = 1041, where odd sums are no float32 numbers: the kernel must widen."""
    op, a = make("dense", units=1, use_bias=False)
    assert run(op, a, np.full((1, k), 127), np.full((1, k), 127)).tolist() == [[16129 * k]]


@settings(max_examples=25, deadline=None)
@given(st.integers(1041, 6000), st.sampled_from([127, 255, 1 << 12]), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_dense_and_conv2d_in_float32_blocks_are_exact(k, m, rows, seed):
    """Past float32's bound over all k terms (|x| |w| k >= 2^24), float32 in blocks of fewer terms (each block's sums
    below 2^24), the blocks added in float64: the exact int64 sums, at the extremes too, for dense and for a conv2d
    of k = C kh kw terms; the form is float32 (the cheaper products) wherever a block holds MIN_TERMS terms."""
    from cvm_onnx.core.ops import nn

    rng = np.random.default_rng(seed)
    x = rng.integers(-m, m + 1, (rows, k))
    w = rng.integers(-127, 128, (2, k))
    x[0, : k // 2], w[0] = m, 127  # a row of the largest sums
    dtype, terms = nn.exact_form(x, w, k)
    assert (dtype, terms) == ((np.float32, (2**24 - 1) // (m * 127)) if (2**24 - 1) // (m * 127) >= nn.MIN_TERMS
                              else (np.float64, k))
    op, a = make("dense", units=2, use_bias=False)
    assert np.array_equal(run(op, a, x, w), x @ w.T)
    c = k // 4
    xc, wc = x[:, : 4 * c].reshape(rows, c, 2, 2), w[:, : 4 * c].reshape(2, c, 2, 2)
    op, a = make("conv2d", channels=2, kernel_size=(2, 2), use_bias=False)
    assert np.array_equal(run(op, a, xc, wc).reshape(rows, 2), x[:, : 4 * c] @ w[:, : 4 * c].T)


def test_dense_exact_past_the_float64_bound():
    """(2^27+1)^2 = 2^54 + 2^28 + 1 is no float64 number; int32 accumulation leaves 2^28 + 1."""
    op, a = make("dense", units=1, use_bias=False)
    v = (1 << 27) + 1
    assert run(op, a, [[v]], [[v]]).tolist() == [[(1 << 28) + 1]]


def test_dense_rules():
    op = REGISTRY["dense"]
    assert "units is required" in errors_of("dense")
    assert "units" in errors_of("dense", units="0")
    a = op.bind(op.parse_attrs({"units": "10"})[0])
    assert a.as_dict() == dict(units=10, use_bias=True) and op.arity(a) == (3, 3)
    assert op.infer_shapes(a, [(3, 64), (10, 64), (10,)]) == [(3, 10)]
    assert op.infer_precisions(a, [8, 8, 12], [(3, 64), (10, 64), (10,)]) == [8 + 8 + 7 + 1]  # bits(64) = 7
    _, nb = make("dense", units=10, use_bias=False)
    assert op.arity(nb) == (2, 2) and op.infer_precisions(nb, [8, 8], [(3, 63), (10, 63)]) == [8 + 8 + 6]
    with pytest.raises(OpRuleError, match=r"weight shape \(10, 63\) must be \(units, K\) = \(10, 64\)"):
        op.infer_shapes(a, [(3, 64), (10, 63), (10,)])
    with pytest.raises(OpRuleError, match="2-D"):
        op.infer_shapes(a, [(3, 4, 16), (10, 64), (10,)])
    with pytest.raises(OpRuleError, match=r"bias shape \(3,\) must be \(units,\) = \(10,\)"):
        op.infer_shapes(a, [(3, 64), (10, 64), (3,)])
    with pytest.raises(OpRuleError, match="must be <= 8"):
        op.infer_precisions(a, [9, 8, 8], [(3, 64), (10, 64), (10,)])


# -- max_pool2d ---------------------------------------------------------------------------------------------
def pool_oracle(x, k, s, p, ceil_mode):
    """FORMAL: start from INT32_MIN, max over the window positions inside the input."""
    n_, c_, h, w = x.shape
    out = [((size + 2 * pp - kk + (ss - 1 if ceil_mode else 0)) // ss + 1) for size, kk, ss, pp in
           zip((h, w), k, s, p)]
    y = np.zeros((n_, c_, *out), np.int64)
    for n in range(n_):
        for c in range(c_):
            for i in range(out[0]):
                for j in range(out[1]):
                    m = INT32_MIN
                    for r in range(k[0]):
                        for q in range(k[1]):
                            ih, iw = i * s[0] + r - p[0], j * s[1] + q - p[1]
                            if 0 <= ih < h and 0 <= iw < w:
                                m = max(m, int(x[n, c, ih, iw]))
                    y[n, c, i, j] = m
    return y


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_max_pool2d_matches_loop_oracle(data):
    k = (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)))
    p = tuple(data.draw(st.integers(0, kk - 1)) for kk in k)
    s = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    hw = tuple(data.draw(st.integers(max(1, kk - 2 * pp), 7)) for kk, pp in zip(k, p))
    ceil_mode = data.draw(st.booleans())
    x = np.array(data.draw(st.lists(st.integers(INT32_MIN, INT32_MAX) | st.integers(-3, 3),
                                    min_size=2 * hw[0] * hw[1], max_size=2 * hw[0] * hw[1]))).reshape(1, 2, *hw)
    one_value = p[0] == p[1] and data.draw(st.booleans())
    op, a = make("max_pool2d", pool_size=k, strides=s, padding=(p[0],) if one_value else p, ceil_mode=ceil_mode)
    outs = [(size + 2 * pp - kk + (ss - 1 if ceil_mode else 0)) // ss + 1 for size, kk, ss, pp in zip(hw, k, s, p)]
    if ceil_mode and any((o - 1) * ss - pp >= size for o, ss, pp, size in zip(outs, s, p, hw)):
        with pytest.raises(OpRuleError, match="ceil_mode"):
            op.infer_shapes(a, [x.shape])
        return
    y = run(op, a, x)
    assert y.shape == (1, 2, *outs)
    assert np.array_equal(y, pool_oracle(x, k, s, p, ceil_mode))
    assert y.min() > INT32_MIN or x.min() == INT32_MIN  # padding never wins


def test_max_pool2d_verified_value():
    op, a = make("max_pool2d", pool_size="(2, 2)", strides="(2, 2)", padding="(1, 1)")
    assert run(op, a, -np.arange(1, 10).reshape(1, 1, 3, 3)).ravel().tolist() == [-1, -2, -4, -5]
    op, a = make("max_pool2d", pool_size="(2, 2)", strides="(2, 2)", padding="1")
    assert run(op, a, -np.arange(1, 10).reshape(1, 1, 3, 3)).ravel().tolist() == [-1, -2, -4, -5]


def test_max_pool2d_rules():
    op = REGISTRY["max_pool2d"]
    a = op.bind(op.parse_attrs({"pool_size": "(2, 2)"})[0])
    assert a.as_dict() == dict(pool_size=(2, 2), strides=(1, 1), padding=(0, 0), layout="NCHW", ceil_mode=False)
    assert op.infer_precisions(a, [13], [(1, 1, 4, 4)]) == [13]
    assert "pool_size is required" in errors_of("max_pool2d")
    for bad in (dict(pool_size="(2,)"), dict(strides="(0, 1)"), dict(strides="(2,)"), dict(padding="(1, 1, 1)"),
                dict(padding="-1"), dict(padding="(0, 4097)"), dict(layout="NHWC")):
        assert errors_of("max_pool2d", **{"pool_size": "(2, 2)", **bad}), bad

    def shape(x, **attrs):
        _, a = make("max_pool2d", **attrs)
        return op.infer_shapes(a, [x])[0]

    assert shape((1, 1, 5, 6), pool_size=(3, 3), strides=(2, 2)) == (1, 1, 2, 2)
    assert shape((1, 1, 5, 6), pool_size=(3, 3), strides=(2, 2), ceil_mode=True) == (1, 1, 2, 3)
    assert shape((1, 1, 3, 3), pool_size=(5, 5), padding=(1,)) == (1, 1, 1, 1)
    with pytest.raises(OpRuleError, match=r"pool_size 6 must lie in \[0, H\+2\*padding\] = \[0, 5\]"):
        shape((1, 1, 3, 3), pool_size=(6, 5), padding=(1,))
    with pytest.raises(OpRuleError, match="padding 2 must be < pool_size 2"):
        shape((1, 1, 3, 3), pool_size=(3, 2), padding=(1, 2))
    with pytest.raises(OpRuleError, match="4-D"):
        shape((1, 3, 3), pool_size=(2, 2))
    # ceil_mode: out = (1+2-2+2)/3+1 = 2, (2-1)*3-1 = 2 is not < H=1
    with pytest.raises(OpRuleError, match=r"\(out-1\)\*stride-padding = 2 must be < H = 1"):
        shape((1, 1, 1, 4), pool_size=(2, 2), strides=(3, 1), padding=(1, 1), ceil_mode=True)


# -- upsampling, relu ---------------------------------------------------------------------------------------
@FAST
@given(st.integers(1, 4), st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)),
       st.integers(0, 2 ** 32))
def test_upsampling_matches_loop_oracle(scale, shape, seed):
    x = np.random.default_rng(seed).integers(INT32_MIN, INT32_MAX, shape, endpoint=True)
    op, a = make("upsampling", scale=scale)
    y = run(op, a, x)
    n_, c_, h, w = shape
    assert y.shape == (n_, c_, h * scale, w * scale)
    for n, c, i, j in np.ndindex(*y.shape):
        assert y[n, c, i, j] == x[n, c, i // scale, j // scale]


def test_upsampling_rules():
    op = REGISTRY["upsampling"]
    a = op.bind(op.parse_attrs({"scale": "2"})[0])
    assert a.as_dict() == dict(scale=2, layout="NCHW", method="NEAREST_NEIGHBOR")
    assert op.infer_precisions(a, [7], [(1, 1, 2, 2)]) == [7]
    assert "scale is required" in errors_of("upsampling")
    for bad in (dict(scale="0"), dict(scale="4097"), dict(method="BILINEAR"), dict(layout="NHWC")):
        assert errors_of("upsampling", **{"scale": "2", **bad}), bad
    with pytest.raises(OpRuleError, match="4-D"):
        op.infer_shapes(a, [(1, 2, 2)])


@FAST
@given(st.lists(st.integers(INT32_MIN, INT32_MAX) | st.sampled_from([INT32_MIN, -1, 0, 1, INT32_MAX]),
                min_size=1, max_size=30), st.integers(1, 32))
def test_relu(values, p):
    op, a = make("relu")
    x = np.array(values)
    y = run(op, a, x)
    assert y.tolist() == [v if v > 0 else 0 for v in values]
    assert op.infer_precisions(a, [p], [x.shape]) == [p]
    assert errors_of("relu", alpha="1")


@pytest.mark.parametrize("stuffed", [False, True])
def test_conv2d_holds_its_blocks_to_a_few_mib(stuffed):
    """A convolution of a ViT decoder's size (768 channels in, 256 out, 4x4): its im2col and its weights in float64
    are taken in blocks of nn.COLS values (8 MiB each): under 28 MiB allocated while it runs beside its output, of
    a dense input and of a transposed convolution's (every other row and column 0: ``nn._lattice``) alike."""
    import tracemalloc

    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, (1, 768, 32, 32), dtype=np.int32)
    if stuffed:
        x[:, :, 1::2], x[:, :, :, 1::2] = 0, 0
    w = rng.integers(-127, 128, (256, 768, 4, 4), dtype=np.int32)
    op, a = make("conv2d", channels=256, kernel_size=(4, 4), use_bias=False)
    tracemalloc.start()
    try:
        y = op.run(a, [x, w])[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak - y.nbytes < 28 << 20
    assert np.array_equal(y[0, :2, :2, :2], conv_oracle(x[:, :, :5, :5], w[:2], None, (1, 1), (0, 0), (1, 1), 1)[0])
