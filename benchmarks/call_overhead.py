"""What one custom-op call costs in an onnxruntime session: a chain of N trivial cvm.native ``conv_requantize_uint8``
nodes (1 x 1 kernel, 16 channels, one position: almost no work) against a chain of N built-in Clip nodes on the
same (1, 1, 1, 16) uint8 tensor, one thread, best of five medians; the difference per node is what each custom-op
call adds (the ResNet-20 serving form makes 21 such calls per image).

Run: python benchmarks/call_overhead.py [--nodes N] [--runs N]
"""
from __future__ import annotations

import argparse

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.native import DOMAIN
from cvm_onnx.runtime.sessions import session

from bench import machine, median_ms  # benchmarks/ is the script's folder on sys.path


def chain(kind: str, nodes: int):
    """N nodes in a row on x (1, 1, 1, 16) uint8: conv_requantize_uint8 (weights 128: products 0) or Clip to
    [0, 255]."""
    inits = [numpy_helper.from_array(np.full((16, 16), 128, np.uint8), "w"),
             numpy_helper.from_array(np.zeros(16, np.int32), "b"),
             numpy_helper.from_array(np.array(0, np.uint8), "lo"), numpy_helper.from_array(np.array(255, np.uint8), "hi")]
    x, graph_nodes = "x", []
    for i in range(nodes):
        if kind == "custom":
            graph_nodes.append(helper.make_node("conv_requantize_uint8", [x, "w", "b"], [f"y{i}"], domain=DOMAIN,
                                                kernel_shape=[1, 1], nhwc=1, offset=0, zero=0, steps=[3, 0, 255]))
        else:
            graph_nodes.append(helper.make_node("Clip", [x, "lo", "hi"], [f"y{i}"]))
        x = f"y{i}"
    graph = helper.make_graph(graph_nodes, kind, [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 1, 16])],
                              [helper.make_tensor_value_info(x, TensorProto.UINT8, None)], inits)
    return onnx_model(graph, domains={DOMAIN: 1})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=21)
    ap.add_argument("--runs", type=int, default=20000)
    args = ap.parse_args()
    feeds = {"x": np.ones((1, 1, 1, 16), np.uint8)}
    print(f"machine: {machine()}", flush=True)
    times = {}
    for kind in ("custom", "builtin"):
        sess = session(chain(kind, args.nodes), threads=1)
        want = np.zeros_like(feeds["x"]) if kind == "custom" else feeds["x"]  # products 0, clipped; x itself
        assert np.array_equal(sess.run(None, feeds)[0], want)
        times[kind] = median_ms(lambda: sess.run(None, feeds), args.runs) * 1e3
        print(f"{args.nodes} {'conv_requantize_uint8' if kind == 'custom' else 'Clip'} nodes: {times[kind]:.1f} us "
              "per run", flush=True)
    print(f"each custom-op call adds {(times['custom'] - times['builtin']) / args.nodes:.2f} us to a built-in node's")


if __name__ == "__main__":
    main()
