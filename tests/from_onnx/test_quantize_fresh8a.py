"""What an eighth corpus of vision models shipped in wheels met in quantize: LayerNormalization over 256-383 values
of full-range 8-bit integers (SVTRv2's and TesseraNet's 320), where V = n^2 var fits 32 bits but the labels of its
steps do not (n sum u^2 takes label(n w^2 / 4) + label(n) bits); the form takes the quartered variance there,
equal to the integer oracle and within its bound of float."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from test_quantized_rules import check_layernorm

from cvm_onnx.converters.from_onnx.quantized.norm import layernorm_plan


@settings(max_examples=10, deadline=None)
@given(n=st.integers(129, 383), x_type=st.sampled_from([T.INT8, T.UINT8]),
       kind=st.sampled_from(["random", "extremes", "band", "one off"]), has_beta=st.booleans(),
       seed=st.integers(0, 2**16))
@example(n=320, x_type=T.UINT8, kind="extremes", has_beta=True, seed=0)
@example(n=256, x_type=T.INT8, kind="random", has_beta=False, seed=1)
def test_layernorm_whose_variance_steps_pass_32_bit_labels_imports(n, x_type, kind, has_beta, seed):
    """n = 129..383 over the whole 8-bit range: imports (it was refused from n = 256 on, 'precision bound exceeded:
    broadcast_mul of inputs with precisions [24, 10] needs 34 bits'), equal to the oracle, every unsaturated
    output within 1/2 + delta of the float LayerNormalization (check_layernorm)."""
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 127) if x_type == T.INT8 else (0, 255)
    c = int(rng.integers(lo + 20, hi - 20))
    x = {"random": lambda: rng.integers(lo, hi + 1, (2, n)),
         "extremes": lambda: np.where(rng.integers(0, 2, (2, n)) == 0, lo, hi),
         "band": lambda: np.clip(c + rng.integers(-2, 3, (2, n)), lo, hi),
         "one off": lambda: np.where(np.arange(n) == rng.integers(0, n), hi, np.full((2, n), c))}[kind]()
    zx = int(rng.integers(-20, 20)) + (0 if x_type == T.INT8 else 128)
    gamma = rng.integers(-127, 128, n)
    beta = rng.integers(-3000, 3000, n) if has_beta else None
    check_layernorm(x.shape, -1, x_type, T.UINT8, 0.027, 0.05, 1e-5, 0.006, False, zx, 75, gamma, beta, x,
                    must_import=True)


def test_the_direct_variance_is_kept_where_its_labels_fit():
    """255 values of [0, 255] keep V's direct steps (no quartering: labels 23 + 9, 2 x 16 and 31 + 1 bits); 256
    quarter it."""
    g = np.array([Fraction(1)] * 256, dtype=object)
    assert layernorm_plan(255, 0, 255, Fraction(1, 16), Fraction(1, 10**5), g[:255], g[:255] * 0, 0, 255).quarter == 0
    assert layernorm_plan(256, 0, 255, Fraction(1, 16), Fraction(1, 10**5), g, g * 0, 0, 255).quarter >= 1
