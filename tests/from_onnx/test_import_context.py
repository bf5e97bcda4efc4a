"""The import context's own lowering: a clip to one value v, which CVM's clip refuses (a_min < a_max), emitted as
clip(clip(x, v - 1, v), v, v + 1); every value of x becomes v, on the reference executor and its ONNX export. A v
within 2 of int32's ends (its bound v +- 1 past a clip's 2^31 - 2) is refused, naming the rule."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cvm_onnx.converters.from_onnx.context import Importer
from cvm_onnx.converters.from_onnx.registry import Refuse
from cvm_onnx.core.constants import INT32_MAX
from cvm_onnx.core.executor import execute
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.verify import verify


@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.int32, hnp.array_shapes(max_dims=3, max_side=5), elements=st.integers(-INT32_MAX, INT32_MAX)),
       v=st.integers(-INT32_MAX + 2, INT32_MAX - 2) | st.integers(-3, 3)
       | st.sampled_from([-INT32_MAX + 2, INT32_MAX - 2]))
def test_a_clip_to_one_value_gives_that_value(x, v):
    ctx = Importer()
    data = ctx.variable("data", x.shape, 32)
    graph = validate(Graph(ctx.nodes, [ctx.emit("clip", data, a_min=v, a_max=v)], ctx.params)).graph
    [got] = execute(graph, {"data": x})
    assert np.array_equal(got, np.full(x.shape, v, np.int32))
    assert verify(graph, x).exact


@pytest.mark.parametrize("v", [INT32_MAX - 1, -INT32_MAX + 1, INT32_MAX, -INT32_MAX])
def test_a_clip_to_one_value_at_the_ends_is_refused(v):
    """v = +-(2^31 - 2) would need a clip bound of 2^31 - 1 (33 bits by the runtime's GetNumberPrecision): refused
    by its own rule. Before: 'precision bound exceeded: clip ... needs 33 bits' (a hypothesis draw, v = 2^31 - 2)."""
    ctx = Importer()
    with pytest.raises(Refuse, match=f"clip to the one value {v}: CVM's clip needs a_min < a_max"):
        ctx.emit("clip", ctx.variable("data", (2,), 32), a_min=v, a_max=v)
