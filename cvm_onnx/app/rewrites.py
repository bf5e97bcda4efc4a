"""Graph rewrites before quantize_static, each exact (the same float model), where onnxruntime's tools would leave
or make what CVM cannot hold: an Einsum of a computed tensor and a constant as the MatMul it is (quantize_static
quantizes MatMul and leaves Einsum in float; tf2onnx writes Keras' EinsumDense and attention's output projection
so: ``abcd,cde->abe``); a bias shared by several convolutions or Gemms given to each its own copy (quantize_static
copies it under a name that may already be another tensor's)."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _terms(equation: str) -> tuple[str, str, str] | None:
    """(the two operands' letters, the output's) of an explicit two-operand equation without ellipsis, each letter
    once per term; else None."""
    eq = equation.replace(" ", "")
    if "..." in eq or eq.count("->") != 1:
        return None
    left, out = eq.split("->")
    terms = left.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) or not t.isalpha() for t in (*terms, out) if t) or not out:
        return None
    return terms[0], terms[1], out


def _plan(x: str, w: str, out: str) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """For x's letters, the constant's and the output's: (x's permutation to batch + contracted letters, the
    constant's to contracted + its output letters, the output's from batch + those, the output letters' positions
    in w); None unless every letter of x is a batch letter (in the output) or contracted (in w), every letter of w
    contracted or an output letter, and some letter is contracted."""
    batch = [c for c in out if c in x]
    summed = [c for c in w if c in x and c not in out]
    kept = [c for c in out if c in w]
    if not summed or set(x) != set(batch) | set(summed) or set(w) != set(summed) | set(kept) or \
            set(out) != set(batch) | set(kept) or set(batch) & set(w):
        return None
    xp = [x.index(c) for c in batch + summed]
    wp = [w.index(c) for c in summed + kept]
    op = [(batch + kept).index(c) for c in out]
    return xp, wp, op, [w.index(c) for c in kept]


def einsums_as_matmuls(graph: onnx.GraphProto) -> int:
    """Replace each Einsum of a computed tensor and a float constant (an initializer), in either order, whose
    letters are batch letters of the computed tensor, letters summed against the constant and the constant's own
    output letters, by Transpose (where the order needs it), Reshape to (batch..., K), MatMul by the constant
    transposed and reshaped to (K, N) (a new initializer), Reshape to the output dims and Transpose: the same sums
    of the same products. Returns how many were replaced."""
    inits = {t.name: t for t in graph.initializer}
    done = 0
    for node in [n for n in graph.node if n.op_type == "Einsum" and n.domain in ("", "ai.onnx")]:
        eq = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
        terms = _terms(eq)
        if terms is None or len(node.input) != 2:
            continue
        k = next((i for i in (1, 0) if node.input[i] in inits and node.input[1 - i] not in inits), None)
        if k is None:
            continue
        xl, wl, out = (terms[1 - k], terms[k], terms[2])
        plan = _plan(xl, wl, out)
        w = numpy_helper.to_array(inits[node.input[k]])
        if plan is None or w.dtype.kind != "f" or w.ndim != len(wl):
            continue
        xp, wp, op, kept = plan
        nb = len(xl) - (len(wl) - len(kept))
        wt = w.transpose(wp)
        kdim = math.prod(wt.shape[:len(wl) - len(kept)])
        name, base = node.output[0], node.name or node.output[0]
        mat = numpy_helper.from_array(np.ascontiguousarray(wt.reshape(kdim, -1)), f"{base}:matmul_w")
        xshape = numpy_helper.from_array(np.array([0] * nb + [-1], np.int64), f"{base}:x_shape")
        yshape = numpy_helper.from_array(np.array([0] * nb + [w.shape[i] for i in kept], np.int64),
                                         f"{base}:y_shape")
        graph.initializer.extend([mat, xshape, yshape])
        x, new = node.input[1 - k], []
        if xp != sorted(xp):
            new.append(helper.make_node("Transpose", [x], [f"{base}:x_t"], perm=xp, name=f"{base}:x_t"))
            x = f"{base}:x_t"
        new += [helper.make_node("Reshape", [x, xshape.name], [f"{base}:x_2d"], name=f"{base}:x_2d"),
                helper.make_node("MatMul", [f"{base}:x_2d", mat.name], [f"{base}:mm"], name=f"{base}:MatMul")]
        if op != sorted(op):
            new += [helper.make_node("Reshape", [f"{base}:mm", yshape.name], [f"{base}:y"], name=f"{base}:y"),
                    helper.make_node("Transpose", [f"{base}:y"], [name], perm=op, name=f"{base}:y_t")]
        else:
            new.append(helper.make_node("Reshape", [f"{base}:mm", yshape.name], [name], name=f"{base}:y"))
        at = list(graph.node).index(node)
        for i, n in enumerate(new):
            graph.node.insert(at + i, n)
        graph.node.remove(node)
        if all(node.input[k] not in n.input for n in graph.node) and \
                node.input[k] not in {o.name for o in graph.output}:
            graph.initializer.remove(inits.pop(node.input[k]))
        done += 1
    return done


BIASED = {"Conv", "ConvTranspose", "Gemm"}


def unshared_biases(graph: onnx.GraphProto) -> int:
    """Give each Conv, ConvTranspose or Gemm whose bias initializer another node also reads a copy of its own,
    named ``<bias>:<k>`` (a name no tensor has): quantize_static quantizes a bias per node, at that node's input
    and weight scales, and copies a shared one as ``<bias><n>`` checking only initializer names, so a node's output
    of that name (tf2onnx's ``conv1d_25;conv1d_252`` beside the bias ``conv1d_25;conv1d_25`` in basic-pitch) was
    read as the bias. Returns how many copies were made."""
    inits = {t.name: t for t in graph.initializer}
    readers = {}
    for n in graph.node:
        for x in set(n.input):
            readers[x] = readers.get(x, 0) + 1
    names = set(inits) | {x for n in graph.node for x in (*n.input, *n.output)} | {v.name for v in graph.input}
    made = 0
    for n in graph.node:
        if n.op_type not in BIASED or len(n.input) < 3 or n.input[2] not in inits or readers[n.input[2]] < 2:
            continue
        old, k = n.input[2], 1
        while f"{old}:{k}" in names:
            k += 1
        copy = onnx.TensorProto()
        copy.CopyFrom(inits[old])
        copy.name = f"{old}:{k}"
        names.add(copy.name)
        graph.initializer.append(copy)
        n.input[2] = copy.name
        readers[old] -= 1
        made += 1
    return made
