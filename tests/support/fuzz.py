"""The fuzzing support of the reliability tests: extreme numbers, seed models covering every op, mutated cases,
and ``bounded``, which runs one case within the time and memory bounds (tests/core/test_reliability.py states them)."""
from __future__ import annotations

import contextlib
import copy
import functools
import resource
import time
import tracemalloc
from collections.abc import MutableSequence
from typing import Any, Callable

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

from cvm_onnx.converters.from_onnx import RULES
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.format import write_params, write_symbol
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.ops import REGISTRY

from . import operator_cases

SECONDS = 2.0
SECONDS_PER_MB = 4.0
#: Wall-clock slack over the CPU-time limit: the limit is on the work done (CPU time, which other jobs sharing the
#: cores do not inflate), the wall clock only catches a hang that burns no CPU.
WALL_FACTOR = 5
MEMORY_FACTOR = 100
MEMORY_ALLOWANCE = 16 << 20  # protobuf, numpy and onnx state that does not grow with the input
ADDRESS_SPACE_ALLOWANCE = 2 << 30  # new thread stacks, allocator arenas, mapped libraries
EXTREMES = (0, 1, -1, 2, 7, 8, 31, 32, 33, 127, 128, -128, 255, 256, 1 << 24, (1 << 24) + 1, 1 << 30,
            (1 << 31) - 1, 1 << 31, -(1 << 31), -(1 << 31) - 1, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63,
            -(1 << 63), 1 << 64, 10 ** 30)


# -- seeds: small builder-made graphs covering all the ops-------------------------------------------------------
def _values(rng: np.random.Generator, shape: tuple[int, ...], p: int = 8) -> np.ndarray:
    b = (1 << (p - 1)) - 1
    return rng.integers(-b, b + 1, shape).astype(np.int32)


@functools.cache
def seed_graphs() -> dict[str, Graph]:
    rng = np.random.default_rng(7)
    graphs = {}

    b = GraphBuilder()
    y = b.op("conv2d", b.input("data", (1, 3, 8, 8), 8), b.param("cw", _values(rng, (4, 3, 3, 3))),
             b.param("cb", _values(rng, (4,), 12), 12), channels=4, kernel_size=(3, 3), padding=(1, 1))
    y = b.op("relu", b.op("cvm_right_shift", y, shift_bit=6, precision=8))
    y = b.op("flatten", b.op("upsampling", b.op("max_pool2d", y, pool_size=(2, 2), strides=(2, 2)), scale=2))
    y = b.op("dense", y, b.param("dw", _values(rng, (5, 256))), b.param("db", _values(rng, (5,), 10), 10), units=5)
    graphs["cnn"] = b.build(b.op("cvm_clip", y, precision=8))

    b = GraphBuilder()
    x = b.input("data", (2, 3, 4), 8)
    c = b.param("c", _values(rng, (3, 4), 6), 6)
    d = b.param("d", np.array([[3, -5, 7, 1]], np.int32), 4)
    q = b.op("broadcast_div", b.op("broadcast_max", b.op("broadcast_mul", b.op(
        "broadcast_sub", b.op("broadcast_add", x, c), d), c), x), d)
    e = b.op("elemwise_sub", b.op("elemwise_add", b.op("abs", x), b.op("negative", x)), b.op("clip", x, a_min=-5,
                                                                                             a_max=5))
    s = b.op("sum", b.op("cvm_left_shift", e, shift_bit=2, precision=16), axis=(1,), keepdims=True)
    w = b.op("where", b.op("broadcast_greater", q, x), x, b.op("cvm_clip", q, precision=8))
    graphs["elementwise"] = b.build(b.op("cvm_right_shift", s, shift_bit=3, precision=8), b.op("max", q, axis=(0, 2)),
                                    b.op("cvm_precision", x), w)

    b = GraphBuilder()
    x = b.input("data", (2, 3, 4), 8)
    t = b.op("transpose", b.op("reshape", b.op("squeeze", b.op("expand_dims", x, axis=1), axis=(1,)),
                               shape=(3, 2, 4)), axes=(2, 0, 1))
    t = b.op("tile", b.op("repeat", b.op("strided_slice", t, begin=(0, 1), end=(4, 3), stride=(1, 1)), repeats=2,
                          axis=1), reps=(1, 2))
    k = b.op("take", t, b.param("idx", np.array([[0, 3], [1, 9]], np.int32)), axis=0)
    lut = b.op("cvm_lut", b.op("relu", x), b.param("table", _values(rng, (16,))), in_dim=16)
    sl = b.op("slice_like", lut, b.param("like", _values(rng, (1, 2, 2))), axis=(1, 2))
    graphs["transform"] = b.build(k, b.op("concatenate", sl, sl, axis=0))

    b = GraphBuilder()
    counts, rows = b.op("get_valid_counts", b.input("data", (1, 5, 6), 8), score_threshold=0)
    graphs["vision"] = b.build(b.op("non_max_suppression", rows, counts, iou_threshold=50, force_suppress=True,
                                    top_k=3))
    covered = {n.op for g in graphs.values() for n in g.nodes if not n.is_variable}
    for op in sorted(set(REGISTRY) - covered):  # an op defined since these seeds: its documented cases
        graphs.update({f"{op}{k}": graph for k, (_, graph) in enumerate(operator_cases()[op])})
    return graphs


class Seeds(dict):
    """Seed files by name, with a short repr for hypothesis' reports."""

    def __repr__(self) -> str:
        return f"Seeds({', '.join(self)})"


def files_of(graph: Graph) -> tuple[str, bytes]:
    """The symbol text and params bytes of a graph, as write_model writes them."""
    precisions = {n.name: n.outputs[0].precision for n in graph.nodes if n.is_variable}
    return write_symbol(graph), write_params(graph.params, {k: precisions[k] for k in graph.params})


@functools.cache
def onnx_seeds() -> Seeds:
    """The seed graphs exported in both forms, by name (``<seed>`` and ``<seed>/flat``)."""
    return Seeds({f"{name}{'/flat' if inline else ''}": to_onnx(g, inline=inline).SerializeToString()
                  for name, g in seed_graphs().items() for inline in (False, True)})


# -- the pipelines and their bounds ------------------------------------------------------------------------------
class Case:
    """Mutated files: the seed's name, the mutations applied (what hypothesis reports) and the files."""

    def __init__(self, seed: str, steps: tuple[str, ...], files: tuple[Any, ...]):
        self.seed, self.steps, self.files = seed, steps, files

    def __repr__(self) -> str:
        return f"Case({self.seed}: {'; '.join(self.steps) or 'unchanged'})"


@contextlib.contextmanager
def address_space_cap(extra: int):
    """A hard cap on the process' address space, ``extra`` bytes above its current size (Linux), so that a
    runaway allocation fails at once (MemoryError) instead of taking the machine's memory."""
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
    except OSError:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size + extra if hard == resource.RLIM_INFINITY else min(hard, size + extra)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def bounded(run: Callable[[], Any], input_size: int) -> Any:
    """``run()``'s result, or None when it raised a CVMError; fails on any other exception, on taking more than
    SECONDS (+ SECONDS_PER_MB) of CPU time or WALL_FACTOR times that on the wall clock, or on allocating more than
    MEMORY_FACTOR x ``input_size`` (+ MEMORY_ALLOWANCE). The address space is capped meanwhile (with room for
    thread stacks and mappings), so a runaway allocation fails fast."""
    budget = MEMORY_FACTOR * input_size + MEMORY_ALLOWANCE
    limit = SECONDS + SECONDS_PER_MB * input_size / 1e6
    tracemalloc.start()
    start, cpu = time.perf_counter(), time.process_time()
    try:
        with address_space_cap(budget + ADDRESS_SPACE_ALLOWANCE):
            return run()
    except CVMError as e:
        assert e.problems and all(str(p) for p in e.problems)
        return None
    finally:
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert cpu < limit, f"took {cpu:.2f} s of CPU for {input_size} bytes"
        assert seconds < WALL_FACTOR * limit, f"took {seconds:.2f} s for {input_size} bytes"
        assert peak <= budget, f"allocated {peak} bytes for {input_size}"


def mutate_bytes(draw, data: bytes, steps: list[str], what: str) -> bytes:
    """Truncated, or 1 to 4 bytes overwritten."""
    if not data or draw(st.booleans()):
        n = draw(st.integers(0, max(len(data) - 1, 0)))
        steps.append(f"truncate {what} to {n} bytes")
        return data[:n]
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        i, b = draw(st.integers(0, len(out) - 1)), draw(st.integers(0, 255))
        steps.append(f"{what} byte {i} = {b}")
        out[i] = b
    return bytes(out)


def fields(message: Any, path: str = "model") -> list[tuple[Any, Any, int | None, str]]:
    """(message, field descriptor, index or None, path) of every set field of a protobuf message, recursively."""
    out = []
    for fd, value in message.ListFields():
        repeated = isinstance(value, MutableSequence)  # protobuf's repeated containers; str is not mutable
        for k, item in enumerate(value) if repeated else [(None, value)]:
            out.append((message, fd, k, f"{path}.{fd.name}" + (f"[{k}]" if repeated else "")))
            if fd.type == fd.TYPE_MESSAGE:
                out.extend(fields(item, out[-1][3]))
    return out


INTEGER_TYPES = (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT32,
                 FieldDescriptor.CPPTYPE_UINT64, FieldDescriptor.CPPTYPE_ENUM)
ONNX_STRINGS = ["", "data", "../outside.bin", "/etc/hostname", "cvm", "cvm.native", "ai.onnx", "Loop", "If",
                *sorted({op for _, op in RULES})]  # op types with an import rule, so that mutations reach them


@st.composite
def mutated_onnx(draw, seeds: dict[str, bytes]) -> Case:
    """An exported seed with 1 to 3 fields changed (ints to extremes, strings to names or odd values, bytes broken,
    repeated elements deleted, duplicated or swapped), or its serialized bytes broken."""
    name = draw(st.sampled_from(sorted(seeds)))
    data = seeds[name]
    steps: list[str] = []
    if draw(st.integers(0, 5)) == 0:
        broken = mutate_bytes(draw, data, steps, "file")
        return Case(name, tuple(steps), (broken,))
    model = onnx.load_from_string(data)
    names = sorted({n for node in model.graph.node for n in [*node.input, *node.output]})
    for _ in range(draw(st.integers(1, 3))):
        message, fd, k, path = draw(st.sampled_from(fields(model)))
        container = getattr(message, fd.name)
        kind = draw(st.sampled_from(["set", "delete", "duplicate", "swap"])) if k is not None else "set"
        if kind == "delete":
            del container[k]
        elif kind == "duplicate":
            if fd.type == fd.TYPE_MESSAGE:
                container.add().CopyFrom(container[k])
            else:
                container.append(container[k])
        elif kind == "swap":
            j = draw(st.integers(0, len(container) - 1))
            a, b = copy.deepcopy(container[k]), copy.deepcopy(container[j])
            if fd.type == fd.TYPE_MESSAGE:
                container[k].CopyFrom(b)
                container[j].CopyFrom(a)
            else:
                container[k], container[j] = b, a
            kind = f"swap with {j}"
        elif fd.type in (fd.TYPE_STRING, fd.TYPE_BYTES) or fd.cpp_type in INTEGER_TYPES:
            if fd.type == fd.TYPE_STRING:
                value = draw(st.sampled_from(ONNX_STRINGS + names))
            elif fd.type == fd.TYPE_BYTES:
                value = mutate_bytes(draw, container if k is None else container[k], [], "")
            else:
                value = draw(st.sampled_from(EXTREMES))
            try:
                if k is None:
                    setattr(message, fd.name, value)
                else:
                    container[k] = value
                kind = f"set {value!r:.40}"
            except (ValueError, TypeError):
                kind = "keep"  # the extreme does not fit this field's type
        else:
            kind = "keep"
        steps.append(f"{kind} {path}")
    return Case(name, tuple(steps), (model.SerializeToString(),))
