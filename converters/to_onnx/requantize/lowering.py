"""A run's body: ``lower_run`` writes a found chain (``matching``) with its head, as ONNX ops (``run.Run``) or, with
the target's integer products, the native ``requantize`` (``encoding``)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.graph import Graph
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.core.ops.elemwise import round_shift
from cvm_onnx.serving.target import Target

from .. import nn
from ..lowering import Body, Value, unwiden, widen
from .encoding import channel_run, native_run
from .matching import Chain, Grouped, offset_param
from .run import Run
from .steps import steps_of


def lower_run(graph: Graph, chain: Chain, inputs: list[Value], out: Value,
              head_bound: int, target: Target) -> tuple[Body, str]:
    """The body of ``chain`` reading ``inputs`` (the run's input, or the head's data, weight[, bias] and then
    ``head_bound`` bounds the head's output); returns it and its output's name.

    With a head, the run starts from its float32 Conv/Gemm (clips before the first int32 step are taken in float32),
    which also takes a first shift: Round((y + 1/2) * 2^-s) is floor((y + 2^(s-1)) / 2^s) (never a tie, as in
    cvm_right_shift's lowering), with y + 1/2 and the scaling folded into its bias and weights (constants). With the
    ``target``'s integer products (the native library's kernels) the steps are one native ``requantize`` node
    (``native_run``), from the run's input, from a conv2d head's exact integer products where it takes that route
    (``nn.integer_route``, ``nn.conv2d_integer``), or from the head's float32 product (bias included, an integer
    within 2^24) cast to int32. """
    b = Body([out])
    y = _run_body(b, graph, chain, widen(b, inputs), out, head_bound, target)
    unwiden(b, [y])
    return b, y


def _bias(b: Body, graph: Graph, chain: Chain, bias: Value | None) -> Value | None:
    """What ``requantize`` adds to a head's rows products (N, OH * OW, OC): its bias (``bias``, the chain's
    ``channels`` of it where it takes some), or with an ``offset`` param (OC, OH, OW) the constant (OH * OW, OC)
    bias[c] + param[c, p] wrapped to int32 (one per position and channel): the runtime adds the bias, then the
    param, in int32, and int32 additions wrap modulo 2^32 in any order, so the sum is the same int32."""
    ch = chain.channels
    if chain.offset is None:
        if bias is None or ch is None:
            return bias
        return Value(b.Gather(bias.name, b.const(ch), axis=0), (len(ch),), bias.bound)
    p = offset_param(graph, graph.nodes[chain.offset]).astype(np.int64)
    if bias is not None:
        src = graph.nodes[graph.nodes[chain.head].inputs[2].node]
        p = p + graph.params[src.name].astype(np.int64).reshape(-1, 1, 1)
    p = (p if ch is None else p[ch]).reshape(len(p) if ch is None else len(ch), -1)
    wrapped = ((p + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    return Value(b.const(np.ascontiguousarray(wrapped.T), np.int32), wrapped.T.shape, 0)


def _grouped_body(b: Body, graph: Graph, chain: Grouped, inputs: list[Value]) -> str:
    """A ``Grouped`` run: the head's integer products (rows), its offset, then one ``requantize`` with each
    channel's own steps (``channel_run``)."""
    first = chain.parts[0]
    a = REGISTRY["conv2d"].bind(graph.nodes[first.head].attrs)
    if first.unsigned is not None:
        products, attrs = nn.conv2d_unsigned(b, a, inputs[0], first.unsigned.weight, first.unsigned.zero)
    else:
        products, attrs = nn.conv2d_rows(b, a, *inputs[:2])
    bias = _bias(b, graph, replace(first, channels=None), inputs[2] if a.use_bias else None)
    return channel_run(b, products, bias, chain.channel_steps(graph), **attrs)


def _run_body(b: Body, graph: Graph, chain: Chain, inputs: list[Value], out: Value, head_bound: int,
              target: Target) -> str:
    """``lower_run``'s body in ``b`` (int8 params already widened); returns its output's name."""
    if isinstance(chain, Grouped):
        return _grouped_body(b, graph, chain, inputs)
    integer = target.products == "integer"  # the native library's kernels
    steps = [step for i in chain.nodes for step in steps_of(graph, graph.nodes[i], target.cpu_integer)[1]]
    if chain.head is None:
        if integer:
            return native_run(b, inputs[0].name, None, steps)
        r = Run(b, inputs[0])
    elif chain.channels is not None:  # only integer-products heads are shared (``_head``)
        a = REGISTRY["conv2d"].bind(graph.nodes[chain.head].attrs)
        idx = b.const(chain.channels)
        if chain.unsigned is not None:
            products, attrs = nn.conv2d_unsigned(b, a, inputs[0], chain.unsigned.weight[chain.channels],
                                                 chain.unsigned.zero)
        else:
            w = inputs[1]
            w = Value(b.Gather(w.name, idx, axis=0), (len(chain.channels), *w.shape[1:]), w.bound,
                      w.const[chain.channels])
            products, attrs = nn.conv2d_rows(b, a, inputs[0], w)
        return native_run(b, products, _bias(b, graph, chain, inputs[2] if a.use_bias else None), steps, **attrs)
    elif integer and chain.unsigned is not None:
        head = graph.nodes[chain.head]
        a = REGISTRY[head.op].bind(head.attrs)
        if head.op == "dense":
            products, attrs = nn.dense_unsigned(b, inputs[0], chain.unsigned.weight, chain.unsigned.zero), {}
        else:
            products, attrs = nn.conv2d_unsigned(b, a, inputs[0], chain.unsigned.weight, chain.unsigned.zero)
        return native_run(b, products, _bias(b, graph, chain, inputs[2] if a.use_bias else None), steps, **attrs)
    elif integer and graph.nodes[chain.head].op == "conv2d" and nn.integer_route(
            a := REGISTRY["conv2d"].bind(graph.nodes[chain.head].attrs), *inputs[:2], out.shape, target.provider):
        products, attrs = nn.conv2d_integer(b, a, *inputs[:2], target.provider)
        return native_run(b, products, _bias(b, graph, chain, inputs[2] if a.use_bias else None), steps, **attrs)
    else:
        head = graph.nodes[chain.head]
        a = REGISTRY[head.op].bind(head.attrs)
        product = nn.conv2d_float32 if head.op == "conv2d" else nn.dense_float32
        bias = inputs[2] if a.use_bias else None
        if integer:  # the float32 product holds an integer within 2^24 (``_head``): exact as int32
            return native_run(b, b.Cast(product(b, a, *inputs[:2], bias), to=TensorProto.INT32), None, steps)
        if steps[0].kind == "shift":
            s = steps.pop(0).k
            y = b.Round(product(b, a, *inputs[:2], bias, scale=2.0 ** -s, offset=0.5))
            head_bound = round_shift(head_bound, s)
        else:
            y = product(b, a, *inputs[:2], bias)
        r = Run(b, Value(y, (), head_bound), in_float=True)
    for step in steps:
        if not r.apply(step):
            raise AssertionError(f"run through {graph.nodes[chain.nodes[-1]].name} has no exact int32 form")
    return r.finish()
