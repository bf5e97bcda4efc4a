"""The quantized front: models written by onnxruntime.quantization (QDQ and QOperator forms) as integer CVM ops.

Every float tensor between a DequantizeLinear and a QuantizeLinear is held exactly, as integers with a rational
scale (``Real``): ``Scaled`` (t - zero) * scale, with t a CVM integer tensor and scale, zero scalars or arrays
broadcast over it (per channel); ``Summed``, a sum of those (an Add of tensors of different scales); ``Mapped``,
a float function of a ``Scaled`` (Sigmoid, Tanh, ...). DequantizeLinear makes a ``Scaled`` of its integer input
and emits nothing. Float ops on ``Real`` values are integer ops: Conv/MatMul/Gemm accumulate in int32 at scale
s_x * s_w, MaxPool/Reshape/... run the integer rules on t, Relu is max(t, zero). QuantizeLinear requantizes a
``Real`` into its integer type (``requant_plans.plan``: multiply, cvm_right_shift, saturation as clip); a ``Mapped``
becomes a cvm_lut table over its input's integers. A QOperator node is the same composition
(QLinearConv = QuantizeLinear(Conv(DequantizeLinear(x), DequantizeLinear(w)))). See docs/import.md.

The package by concern, each module importing only those before it: ``values`` (the dequantized values and their
scales), ``parameters`` (every quantization parameter checked against its op's schema before a rule computes),
``qdq`` (DequantizeLinear, QuantizeLinear), ``logsumexp`` (ReduceLogSumExp), ``products`` (Conv, MatMul, Gemm,
pooling sums), ``masks`` (an attention mask's term as a table of one integer tensor), ``elementwise`` (Add, Mul,
Relu, Clip, float functions, the Lp pools, LpNormalization), ``moves`` (the integer rules on a dequantized value's
integers), ``norm`` (LayerNormalization), ``lrn`` (LRN), ``recurrent`` (LSTM, GRU and RNN, unrolled), ``qoperator``
(the QLinear* compositions), ``edges`` (the graph's float input and outputs), ``chains`` (written-out softmaxes and
masked means, found in the graph before the walk) and ``l2norm`` (L2 normalization: LpNormalization's p = 2 and the
written-out forms; the L2 norm as a value).
"""
# registers the rules, in the order of the module they were split from
from . import values, parameters, qdq, logsumexp, products, masks, elementwise, moves, norm, lrn, recurrent, qoperator  # noqa: F401, I001
from .chains import MaskedMean, SoftmaxChain, masked_means, softmax_chains, softmax_value
from .l2norm import SUMS, L2Chain, NormChain, l2_chains, l2_value, norm_chains, norm_value
from .edges import InputEdge, float_read, input_edge, input_precision, l2_read, output_edge
from .parameters import problem as parameter_problem
from .masks import Tabulated, constant_term, mask_terms, tabulated
from .qdq import Requant, quantized_constant
from .elementwise import masked_where
from .values import QUANTIZED_TYPES, Real, affine_of_integers, of_integers, quantized_affines

__all__ = ["InputEdge", "L2Chain", "MaskedMean", "NormChain", "QUANTIZED_TYPES", "Real", "Requant", "SUMS",
           "SoftmaxChain", "Tabulated", "affine_of_integers", "constant_term", "float_read", "input_edge",
           "input_precision", "l2_chains", "l2_read", "l2_value", "mask_terms", "masked_means", "masked_where",
           "norm_chains", "norm_value", "of_integers", "output_edge", "parameter_problem", "quantized_affines",
           "quantized_constant", "softmax_chains", "softmax_value", "tabulated"]
