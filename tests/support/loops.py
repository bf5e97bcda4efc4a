"""A while loop as tf2onnx writes a Keras recurrent layer, and a Scan RNN: the models the Loop and Scan tests
unroll and import."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model


def while_rnn(rng, features: int, hidden: int, trip: bool, stop: int | None, scan: bool, branch: bool,
              trip_count: str = "shape", inner: bool = False) -> onnx.ModelProto:
    """A tanh RNN over x (batch, time, features) as tf2onnx writes a Keras while loop: x transposed to
    (time, batch, features), the Loop's trip count the time steps from Shape (``trip``; "values": from the
    input's values instead), its first condition 0 < steps, carried h (zeros of (batch, hidden) built from the
    input's shape) and a counter; the body reads x_t = x[i] from the outer graph, h' = tanh(x_t W + h R + b),
    its condition counter + 1 < ``stop`` (else its condition passed through: the trip count alone stops it), and
    with ``branch`` an If on i == 0 inside whose branches read the body's tensor (h' or -h'); with ``inner`` b a
    body initializer and the counter's 1 a Constant node of the body. Outputs: the final h and with ``scan`` every
    step's h stacked."""
    f32 = lambda *s: (rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    ints = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "i1": np.array([1], np.int64),
            "hid": np.array([hidden], np.int64)}
    inits = [nh.from_array(v, k) for k, v in ints.items()] + [
        nh.from_array(f32(features, hidden), "W"), nh.from_array(f32(hidden, hidden), "R"),
        nh.from_array(f32(hidden) * 0.1, "b"), nh.from_array(np.float32(0), "fzero")]
    body_nodes = [h.make_node("Gather", ["xt", "i"], ["x_t"], axis=0),
                  h.make_node("MatMul", ["x_t", "W"], ["xw"]), h.make_node("MatMul", ["h_in", "R"], ["hr"]),
                  h.make_node("Add", ["xw", "hr"], ["s"]), h.make_node("Add", ["s", "b"], ["a"]),
                  h.make_node("Tanh", ["a"], ["t"]), h.make_node("Add", ["c_in", "one"], ["c_out"])]
    if branch:
        then = h.make_graph([h.make_node("Identity", ["t"], ["u"])], "first", [],
                            [h.make_tensor_value_info("u", T.FLOAT, None)])
        other = h.make_graph([h.make_node("Neg", ["t"], ["v"])], "later", [],
                             [h.make_tensor_value_info("v", T.FLOAT, None)])
        body_nodes += [h.make_node("Equal", ["i", "zero"], ["first"]),
                       h.make_node("If", ["first"], ["h_out"], then_branch=then, else_branch=other)]
    else:
        body_nodes.append(h.make_node("Identity", ["t"], ["h_out"]))
    if stop is not None:
        body_nodes.append(h.make_node("Less", ["c_out", "stop"], ["cond_out"]))
        inits.append(nh.from_array(np.array(stop, np.int64), "stop"))
    else:
        body_nodes.append(h.make_node("Identity", ["cond_in"], ["cond_out"]))
    outs = [h.make_tensor_value_info(n, t, None) for n, t in
            (("cond_out", T.BOOL), ("h_out", T.FLOAT), ("c_out", T.INT64))]
    if scan:
        body_nodes.append(h.make_node("Identity", ["h_out"], ["h_scan"]))
        outs.append(h.make_tensor_value_info("h_scan", T.FLOAT, None))
    body_inits = []
    if inner:  # b and the counter's step inside the body
        b = next(t for t in inits if t.name == "b")
        inits.remove(b)
        body_inits.append(b)
        body_nodes.insert(0, h.make_node("Constant", [], ["step"], value=nh.from_array(np.array(1, np.int64))))
        for n in body_nodes:
            n.input[:] = ["step" if x == "one" and n.op_type == "Add" else x for x in n.input]
    body = h.make_graph(body_nodes, "body", [h.make_tensor_value_info("i", T.INT64, []),
                                             h.make_tensor_value_info("cond_in", T.BOOL, []),
                                             h.make_tensor_value_info("h_in", T.FLOAT, None),
                                             h.make_tensor_value_info("c_in", T.INT64, [])], outs,
                        body_inits)
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             h.make_node("Shape", ["xt"], ["sx"]), h.make_node("Gather", ["sx", "zero"], ["steps"]),
             h.make_node("Gather", ["sx", "i1"], ["batch"]),
             h.make_node("Concat", ["batch", "hid"], ["hshape"], axis=0),
             h.make_node("Expand", ["fzero", "hshape"], ["h0"]),
             h.make_node("Less", ["zero", "steps"], ["go"])]
    if trip_count == "values":  # the trip count from the input's values: 1 + floor(max |x|) steps
        nodes += [h.make_node("Abs", ["x"], ["ax"]), h.make_node("ReduceMax", ["ax"], ["mx"], keepdims=0),
                  h.make_node("Cast", ["mx"], ["mi"], to=T.INT64), h.make_node("Add", ["mi", "one"], ["M"])]
    else:
        nodes.append(h.make_node("Identity", ["steps"], ["M"]))
    nodes.append(h.make_node("Loop", ["M" if trip else "", "go", "h0", "zero"],
                             ["h_last", "count"] + (["h_all"] if scan else []), body=body, name="while_loop"))
    nodes.append(h.make_node("Identity", ["h_last"], ["y"]))
    graph_outs = [h.make_tensor_value_info("y", T.FLOAT, None)]
    if scan:
        graph_outs.append(h.make_tensor_value_info("h_all", T.FLOAT, None))
    g = h.make_graph(nodes, "while_rnn", [h.make_tensor_value_info("x", T.FLOAT, ["batch", "time", features])],
                     graph_outs, inits)
    return onnx_model(g, 17)


PERMS = {0: [0, 1, 2], 1: [1, 0, 2], 2: [1, 2, 0], -1: [1, 2, 0], -2: [1, 0, 2], -3: [0, 1, 2]}


def scan_rnn(rng, features: int, hidden: int, in_axes: list[int], in_dirs: list[int], out_axes: list[int],
             out_dirs: list[int]) -> onnx.ModelProto:
    """A tanh RNN as a Scan over x (time, batch, features): scan input j is x with time moved to axis in_axes[j]
    (read in direction in_dirs[j]); h' = tanh(h W + sum_j x_j[t] U_j); the scan outputs h' and 2 x_0[t] (stacked on
    out_axes, in out_dirs), the final h."""
    f32 = lambda *s: (rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    m = len(in_axes)
    body_nodes = [h.make_node("MatMul", ["h_in", "W"], ["a0"])]
    for j in range(m):
        body_nodes += [h.make_node("MatMul", [f"s{j}", f"U{j}"], [f"p{j}"]),
                       h.make_node("Add", [f"a{j}", f"p{j}"], [f"a{j + 1}"])]
    body_nodes += [h.make_node("Tanh", [f"a{m}"], ["h_out"]), h.make_node("Identity", ["h_out"], ["y0"]),
                   h.make_node("Mul", ["s0", "two"], ["y1"])]
    body = h.make_graph(body_nodes, "body",
                        [h.make_tensor_value_info("h_in", T.FLOAT, None)] +
                        [h.make_tensor_value_info(f"s{j}", T.FLOAT, None) for j in range(m)],
                        [h.make_tensor_value_info(x, T.FLOAT, None) for x in ("h_out", "y0", "y1")])
    nodes = [h.make_node("Transpose", ["x"], [f"x{j}"], perm=PERMS[a]) for j, a in enumerate(in_axes)]
    nodes += [h.make_node("Shape", ["x"], ["sx"]), h.make_node("Gather", ["sx", "one"], ["batch"]),
              h.make_node("Concat", ["batch", "hid"], ["hs"], axis=0), h.make_node("Expand", ["fzero", "hs"], ["h0"]),
              h.make_node("Scan", ["h0"] + [f"x{j}" for j in range(m)], ["h_last", "ys", "xs"], body=body,
                          num_scan_inputs=m, scan_input_axes=in_axes, scan_input_directions=in_dirs,
                          scan_output_axes=out_axes, scan_output_directions=out_dirs, name="scan")]
    inits = [nh.from_array(f32(hidden, hidden), "W"), nh.from_array(np.float32(2), "two"),
             nh.from_array(np.array([1], np.int64), "one"), nh.from_array(np.array([hidden], np.int64), "hid"),
             nh.from_array(np.float32(0), "fzero")] + [nh.from_array(f32(features, hidden), f"U{j}") for j in range(m)]
    g = h.make_graph(nodes, "scan_rnn", [h.make_tensor_value_info("x", T.FLOAT, ["time", "batch", features])],
                     [h.make_tensor_value_info(x, T.FLOAT, None) for x in ("h_last", "ys", "xs")], inits)
    return onnx_model(g, 17)
