"""The reference executor: runs a validated graph with numpy, FORMAL semantics, the oracle of every test.

The input ``data`` is clamped to its declared precision as the runtime does; params are used as stored.
numpy's BLAS (conv2d and dense are matmuls) runs on one thread here: its multi-threaded OpenBLAS busy-waits,
and on a loaded 2-core machine ResNet-20 took 272 ms instead of 15 ms.
"""
from __future__ import annotations

from functools import cache
from typing import Mapping

import numpy as np
from threadpoolctl import ThreadpoolController

from .errors import RuntimeFailure
from .graph import Entry, Graph
from .ops import REGISTRY


def prepare_input(graph: Graph, name: str, value: np.ndarray) -> np.ndarray:
    """``value`` as the runtime takes it: int8 or int32 of exactly the declared shape, clamped to the precision."""
    node = next((graph.nodes[i] for i in graph.inputs if graph.nodes[i].name == name), None)
    if node is None:
        raise RuntimeFailure(f"the model has no input named {name!r}", where=name)
    t = node.outputs[0]
    value = integer_input(value, t.precision, name)
    if tuple(value.shape) != t.shape:
        raise RuntimeFailure(f"input shape {tuple(value.shape)} must be {t.shape}", where=name)
    return np.clip(value.astype(np.int32), -t.bound, t.bound)


def integer_input(value: np.ndarray, precision: int, name: str) -> np.ndarray:
    """An input array as the runtime reads it: int8 or int32 as given (the runtime clamps them to the precision);
    any other integer type (uint8 images, int64, ...) as int32 when every value fits the precision, else refused."""
    value = np.asarray(value)
    if value.dtype in (np.int8, np.int32):
        return value
    if value.dtype.kind not in "iu":
        raise RuntimeFailure(f"input dtype {value.dtype} must be an integer type", where=name)
    b = (1 << (precision - 1)) - 1
    if value.size and (int(value.min()) < -b or int(value.max()) > b):
        raise RuntimeFailure(f"input values in [{value.min()}, {value.max()}] do not fit the model's input precision "
                             f"{precision} (|x| <= {b}); pass int8 or int32 data to have them clamped", where=name)
    return value.astype(np.int32)


def execute(graph: Graph, inputs: Mapping[str, np.ndarray] | np.ndarray,
            keep_all: bool = False) -> list[np.ndarray] | dict[Entry, np.ndarray]:
    """Run ``graph`` (validated) and return the head values in head order (int32).

    ``inputs`` maps input names to arrays (a bare array is the input ``data``). With ``keep_all`` every entry's
    value is returned, keyed by ``Entry``.
    """
    with _blas().limit(limits=1, user_api="blas"):
        return _execute(graph, inputs, keep_all)


@cache
def _blas() -> ThreadpoolController:
    return ThreadpoolController()


def _execute(graph: Graph, inputs: Mapping[str, np.ndarray] | np.ndarray,
             keep_all: bool) -> list[np.ndarray] | dict[Entry, np.ndarray]:
    if not isinstance(inputs, Mapping):
        inputs = {"data": inputs}
    missing = [graph.nodes[i].name for i in graph.inputs if graph.nodes[i].name not in inputs]
    if missing:
        raise RuntimeFailure(f"missing input(s): {', '.join(missing)}")
    last_use: dict[Entry, int] = {}
    if not keep_all:
        for i, node in enumerate(graph.nodes):
            for e in node.inputs:
                last_use[e] = i
        for h in graph.heads:
            last_use[h] = len(graph.nodes)
    values: dict[Entry, np.ndarray] = {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            if node.name in graph.params:
                values[Entry(i)] = graph.params[node.name].astype(np.int32, copy=False)
            else:
                values[Entry(i)] = prepare_input(graph, node.name, inputs[node.name])
            continue
        op = REGISTRY[node.op]
        outs = op.run(op.bind(node.attrs), [values[e] for e in node.inputs])
        for k, out in enumerate(outs):
            values[Entry(i, k)] = out
        if not keep_all:
            for e in set(node.inputs):
                if last_use.get(e) == i:
                    del values[e]
    if keep_all:
        return values
    return [values[h] for h in graph.heads]
