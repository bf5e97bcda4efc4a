"""quantize's memory as glibc sees it: with its mmap threshold fixed (cvm_onnx.app.memory), an array of a few MiB
made after a larger one was freed is mapped apart (handed back when freed), not carved from the heap, as the
threshold's default, risen to the larger block, would have it; prepare holds no weights once they are on disk."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cvm_onnx.app.memory import MMAP_THRESHOLD, map_large_blocks
from cvm_onnx.converters.from_onnx.checks import supported_versions


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mapped_bytes() -> int:
    return _MALLINFO2().hblkhd


try:
    _MALLINFO2 = ctypes.CDLL(None).mallinfo2
    _MALLINFO2.restype = _Mallinfo2
except (OSError, AttributeError):
    _MALLINFO2 = None


@pytest.mark.skipif(_MALLINFO2 is None, reason="glibc's mallinfo2 (2.33 and later) reads the mapped bytes")
@pytest.mark.parametrize("fixed", [True, False])
def test_a_few_mib_after_a_larger_block_freed_are_mapped_apart(fixed):
    """In a fresh interpreter (a heap holding no free chunk of a few MiB, which malloc would take before mapping):
    mapped apart with the threshold fixed, carved from the heap with glibc's default (the test can fail)."""
    code = f"""if True:
        import numpy as np
        from tests.app.test_memory import _mapped_bytes
        from cvm_onnx.app.memory import MMAP_THRESHOLD, map_large_blocks
        if {fixed}:
            map_large_blocks()
        big = np.ones(16 << 20, np.uint8)  # freed: the default threshold would rise to 16 MiB
        del big
        before = _mapped_bytes()
        a = np.ones(4 * MMAP_THRESHOLD, np.uint8)
        print(_mapped_bytes() - before >= a.nbytes)"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=True)
    assert out.stdout.split() == [str(fixed)], out.stderr


@pytest.mark.skipif(_MALLINFO2 is None, reason="glibc's mallinfo2 (2.33 and later) reads the bytes allocated")
def test_prepare_holds_no_weights_while_onnxruntime_optimizes_a_converted_model(tmp_path, monkeypatch):
    """A model below the opset prepare wants is converted, its weights read back into the converted copy, then
    moved out to disk; no message of that copy may outlive it in prepare's frame (protobuf's arena would keep
    the weights): when onnxruntime's optimizer starts, the 32 MiB weight is in no allocation of this process."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import onnxruntime as ort

    from cvm_onnx.app.quantize import prepare

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(2048, 4096)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4096])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
    del w, graph
    allocated = []
    session = ort.InferenceSession

    def optimizing(*args, **kwargs):
        m = _MALLINFO2()
        allocated.append(m.uordblks + m.hblkhd)
        return session(*args, **kwargs)

    supported_versions()  # asked of onnxruntime (once per process) now, not of the stand-in below
    monkeypatch.setattr(ort, "InferenceSession", optimizing)
    m = _MALLINFO2()
    before = m.uordblks + m.hblkhd  # the model's 32 MiB among them
    given = [model]
    del model
    prepare(given, tmp_path / "prepared.onnx")
    assert onnx.load(tmp_path / "prepared.onnx").opset_import[0].version == 13
    assert allocated and allocated[0] < before - (16 << 20)


@pytest.mark.skipif(_MALLINFO2 is None, reason="glibc's mallinfo2 (2.33 and later) reads the heap's size")
def test_the_heaps_top_is_kept_when_blocks_below_the_threshold_are_freed():
    """Fixing the mmap threshold fixes glibc's trim threshold too (128 KiB unless set): the heap would shrink at
    every such free and grow again at the next block. Kept, it is handed back between stages (malloc_trim)."""
    map_large_blocks()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(MMAP_THRESHOLD // 2) for _ in range(16)]  # 8 MiB of heap, at its top
    grown = _MALLINFO2().arena
    for b in reversed(blocks):
        libc.free(b)
    assert _MALLINFO2().arena >= grown - MMAP_THRESHOLD


@pytest.mark.skipif(_MALLINFO2 is None, reason="glibc's mallinfo2 (2.33 and later) reads the bytes allocated")
@pytest.mark.parametrize("fold", [None, {"m": 1.0}], ids=["plain", "folded"])
def test_quantize_holds_no_weights_of_the_model_it_loaded_once_prepare_has_them_on_disk(tmp_path, monkeypatch, fold):
    """quantize loads the float model, checks its inputs (and folds the inputs ``fold`` names), fixes its input's
    dims in a copy and hands that copy to prepare, which moves its weights to disk: no message of the model as
    loaded may outlive it in quantize's frame (protobuf's arena would keep its weights through every stage).
    When onnxruntime's optimizer starts, the 32 MiB weight is held by no allocation of this process."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import onnxruntime as ort

    from cvm_onnx.app.quantize import quantize
    from cvm_onnx.core.errors import RuntimeFailure

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(2048, 4096)).astype(np.float32), "w")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2048])]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    if fold:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1]))
        nodes.append(helper.make_node("Mul", ["y", "m"], ["z"]))
    else:
        nodes.append(helper.make_node("Relu", ["y"], ["z"]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4096])],
                              [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              tmp_path / "float.onnx")
    del w, graph
    np.save(tmp_path / "calibration.npy", np.ones((2, 1, 2048), np.float32))
    allocated = []

    def optimizing(*args, **kwargs):
        m = _MALLINFO2()
        allocated.append(m.uordblks + m.hblkhd)
        raise RuntimeError("stopped where onnxruntime's optimizer starts")

    supported_versions()  # asked of onnxruntime (once per process) now, not of the stand-in below
    monkeypatch.setattr(ort, "InferenceSession", optimizing)
    m = _MALLINFO2()
    before = m.uordblks + m.hblkhd  # the weight is on disk only
    with pytest.raises(RuntimeFailure, match="stopped where"):
        quantize(tmp_path / "float.onnx", tmp_path / "calibration.npy", tmp_path / "m", fold=fold)
    assert allocated and allocated[0] < before + (16 << 20)


def test_quantize_leaves_sympy_to_a_child_process(tmp_path):
    """onnxruntime's symbolic shape inference imports sympy (32 MiB, never handed back): it runs in a forked child
    (``memory.in_child``), so that quantize's process holds no sympy through the stages after the preparation. In a
    fresh interpreter (another test may have imported sympy into this one)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import onnx
    from support.transformers import encoder

    onnx.save(encoder(seed=1, s=5, d=32, heads=4, ff=64, ln="pow"), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(4, 1, 5, 32)).astype(np.float32))
    code = ("import sys\nfrom cvm_onnx.app.quantize import quantize\n"
            f"quantize({str(tmp_path / 'f.onnx')!r}, {str(tmp_path / 'c.npy')!r}, {str(tmp_path / 'm')!r})\n"
            "print('sympy' in sys.modules)")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"]
    assert (tmp_path / "m" / "params").exists()


def test_in_child_raises_what_the_child_raised_and_keeps_its_imports():
    import importlib
    import sys

    from cvm_onnx.app.memory import ChildFailed, in_child

    def fails():
        importlib.import_module("colorsys")  # a module this process has not imported: it stays the child's
        raise ValueError("no shapes")

    had = "colorsys" in sys.modules
    with pytest.raises(ChildFailed, match="ValueError: no shapes"):
        in_child(fails)
    assert ("colorsys" in sys.modules) == had


def _peak_rss() -> int | None:
    """This process's peak RSS (bytes) since the last ``_reset_peak``; None where /proc does not tell."""
    try:
        line = next(x for x in open("/proc/self/status") if x.startswith("VmHWM"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) << 10


def _reset_peak() -> bool:
    """The peak RSS reset to the present RSS (Linux's clear_refs 5); False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _peak_rss() is not None


def _rss() -> int:
    return int(next(x for x in open("/proc/self/status") if x.startswith("VmRSS")).split()[1]) << 10


class _Stopped(Exception):
    pass


def sixteen_matmuls(path: Path) -> np.random.Generator:
    """Write to ``path`` a float model of 16 MatMuls by 1024 x 1024 weights (64 MiB; input (n, 1024)); returns the
    generator that drew them, to draw more."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(1024, 1024)).astype(np.float32), f"w{k}") for k in range(16)]
    nodes = [helper.make_node("MatMul", [f"x{k}", f"w{k}"], [f"x{k + 1}"]) for k in range(16)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["n", 1024])],
                              [helper.make_tensor_value_info("x16", TensorProto.FLOAT, ["n", 1024])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return rng


@pytest.mark.skipif(not _reset_peak(), reason="Linux's /proc/self/clear_refs resets the peak RSS")
def test_quantize_loads_the_model_without_a_second_copy_of_its_weights(tmp_path):
    """Until the preparation starts (the model loaded, checked, its input's dims fixed), quantize holds the 64 MiB
    of weights (16 of 4 MiB) once, and one weight's bytes beside them: the file is parsed initializer by initializer
    (``onnx_file.read_onnx``; ``onnx.load`` held the file's bytes beside the model parsed from them) and the dims
    are fixed in place (a copy held both models)."""
    from cvm_onnx.app.quantize import quantize

    sixteen_matmuls(tmp_path / "float.onnx")
    np.save(tmp_path / "calibration.npy", np.ones((2, 1, 1024), np.float32))
    peaks = []

    def progress(done, total, what):
        peaks.append(_peak_rss() - before)
        raise _Stopped

    _reset_peak()
    before = _rss()
    with pytest.raises(_Stopped):
        quantize(tmp_path / "float.onnx", tmp_path / "calibration.npy", tmp_path / "m", progress=progress)
    assert peaks and peaks[0] < (64 << 20) * 3 // 2


def test_read_onnx_parses_as_onnx_load_does(tmp_path):
    """The model read in pieces equals the one parsed whole, its initializers in their order: as onnx writes it,
    and with its fields in another order (the graph field first); a file that is no model raises onnx.load's
    error."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from cvm_onnx.core.format.onnx_file import GRAPH, _key, read_onnx

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), f"w{k}")
             for k, s in enumerate([(4, 4), (300, 40), (1,), (2, 3, 5)])]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], inits, doc_string="d")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8, producer_name="p")
    onnx.save(model, tmp_path / "a.onnx")
    g = graph.SerializeToString()
    rest = onnx.ModelProto()
    rest.CopyFrom(model)
    rest.ClearField("graph")
    (tmp_path / "b.onnx").write_bytes(_key(GRAPH, len(g)) + g + rest.SerializeToString())
    for name in ("a.onnx", "b.onnx"):
        want = onnx.load(tmp_path / name, load_external_data=False)
        got = read_onnx(tmp_path / name)
        assert got == want and got.SerializeToString() == want.SerializeToString()
        assert [t.name for t in got.graph.initializer] == ["w0", "w1", "w2", "w3"]
    (tmp_path / "c.onnx").write_bytes(b"\x3a\xff\xff\x7f" + b"\x00" * 10)
    with pytest.raises(Exception) as want:
        onnx.load(tmp_path / "c.onnx", load_external_data=False)
    with pytest.raises(type(want.value)):
        read_onnx(tmp_path / "c.onnx")


def test_the_collections_between_quantize_stages_walk_only_what_it_made(tmp_path, monkeypatch):
    """Each collection between quantize's stages skips the objects held before the call (frozen: gc.freeze), and
    the process gets them back on return: in a process holding many (a test run, a service), walking them all at
    every stage cost more than a small model's whole import."""
    import gc

    from cvm_onnx.app.quantize import quantize

    held = [[] for _ in range(50_000)]
    frozen, collect = [], gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: frozen.append(gc.get_freeze_count()) or collect(*a))
    models = Path(__file__).resolve().parents[2] / "models" / "digits_cnn"
    quantize(models / "float.onnx", models / "calibration.npy", tmp_path / "q")
    assert frozen and min(frozen) >= len(held)
    assert gc.get_freeze_count() == 0


@pytest.mark.skipif(not _reset_peak(), reason="Linux's /proc/self/clear_refs resets the peak RSS")
def test_a_model_directory_is_read_without_its_params_bytes_beside_its_arrays(tmp_path):
    """read_model (and quantize, reading its params back after the comparison) reads the params file from the open
    file, array by array: 64 MiB of int8 params (16 of 4 MiB) are read with one array's bytes beside them (the
    file's bytes and the arrays made from them were held at once: 2x), and equal what was written."""
    from cvm_onnx.core.format import read_model, write_model
    from cvm_onnx.core.graph import Entry, Graph, Node, TensorType

    shape = (2048, 2048)
    nodes = [Node("data", "null", outputs=(TensorType(shape, 8),))]
    for k in range(16):
        nodes.append(Node(f"w{k}", "null", outputs=(TensorType(shape, 8),)))
        nodes.append(Node(f"add{k}", "elemwise_add", (Entry(len(nodes) - 2 if k else 0), Entry(len(nodes) - 1)), {},
                          (TensorType(shape, 8),)))
    rng = np.random.default_rng(0)
    graph = Graph(nodes, [Entry(len(nodes) - 1)])
    graph.params = {f"w{k}": rng.integers(-127, 128, size=shape, dtype=np.int8) for k in range(16)}
    write_model(graph, tmp_path / "m")
    want = graph.params
    _reset_peak()
    before = _rss()
    got = read_model(tmp_path / "m").params
    peak = _peak_rss() - before
    assert list(got) == list(want) and all(np.array_equal(got[k], v) and got[k].dtype == v.dtype
                                           for k, v in want.items())
    assert peak < (64 << 20) * 5 // 4


@pytest.mark.skipif(not _reset_peak(), reason="Linux's /proc/self/clear_refs resets the peak RSS")
@pytest.mark.parametrize("at", [None, (0, 0), (4095, 4095)])
def test_non_finite_checks_a_large_weight_without_copies_beside_it(at):
    """non_finite holds one 64 MiB float weight's values (protobuf hands its bytes over as a copy) and masks of a
    few MiB: the masks of the whole weight (isfinite and its negation, 32 MiB) were held beside it. The first
    infinity is found wherever it is, as ``np.argwhere`` finds it."""
    from onnx import TensorProto, helper, numpy_helper

    from cvm_onnx.app.quantize import non_finite

    w = np.ones((4096, 4096), np.float32)
    if at:
        w[-1, -1] = -np.inf
        w[at] = np.inf
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    del w
    _reset_peak()
    before = _rss()
    said = non_finite(model)
    peak = _peak_rss() - before
    assert said is None if at is None else said.startswith(f"the initializer 'w' holds inf at {at}:")
    assert peak < (64 << 20) * 9 // 8


def _peak_between(tmp_path, monkeypatch, opens: tuple[str, int], closes: str) -> tuple[int, int]:
    """quantize's peak RSS above its RSS at the ``k``-th call of ``quantize.<name>`` (``opens``: (name, k)), until
    it calls ``quantize.<closes>``, on a model of 16 MatMuls by 1 MiB weights; and the size of the params file its
    import wrote."""
    import cvm_onnx.app.quantize as q

    rng = sixteen_matmuls(tmp_path / "float.onnx")
    np.save(tmp_path / "calibration.npy", rng.normal(size=(2, 1, 1024)).astype(np.float32))
    start, peaks, sizes, calls = [], [], [], [0]
    name, k = opens
    opened, closing = getattr(q, name), getattr(q, closes)

    def opening(*args, **kwargs):
        calls[0] += 1
        if calls[0] == k:
            _reset_peak()
            start.append(_rss())
        return opened(*args, **kwargs)

    def closed(*args, **kwargs):
        if start:
            peaks.append(_peak_rss() - start[0])
            [params] = tmp_path.glob(".m.*.tmp/params")  # in the stage, until quantize returns
            sizes.append(params.stat().st_size)
            raise _Stopped
        return closing(*args, **kwargs)

    monkeypatch.setattr(q, name, opening)
    monkeypatch.setattr(q, closes, closed)
    with pytest.raises(_Stopped):
        q.quantize(tmp_path / "float.onnx", tmp_path / "calibration.npy", tmp_path / "m")
    return peaks[0], sizes[0]


@pytest.mark.skipif(not _reset_peak(), reason="Linux's /proc/self/clear_refs resets the peak RSS")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the imports run in forked children where the system forks")
def test_quantize_leaves_the_imports_temporaries_to_a_child_process(tmp_path, monkeypatch):
    """The import of the quantized model runs in a forked child (``memory.in_child``), which writes the model and
    its ``Imported``: quantize's process holds at most 1.25x the params from the import's start (its ``_apart``) to
    onnxruntime's runs (``onnx_outputs``), which follow it: 2.4x when the import ran in it (its temporaries' pages
    kept by the heap)."""
    peak, params = _peak_between(tmp_path, monkeypatch, ("_apart", 1), "onnx_outputs")
    assert peak < params * 5 // 4, f"{peak / (1 << 20):.1f} MiB for {params >> 20} MiB of params"


@pytest.mark.skipif(not _reset_peak(), reason="Linux's /proc/self/clear_refs resets the peak RSS")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the imports run in forked children where the system forks")
def test_quantize_leaves_the_one_part_imports_temporaries_to_a_child_process(tmp_path, monkeypatch):
    """Where the import has two-part products, the one-part import that measures their gas runs in a forked child
    too (the second ``_apart``), before the ``Imported`` and its params are read back: at most 1.25x the params
    from then to the CVM model's run (``cvm_outputs``). It ran in quantize's process, after the comparison, with
    its params and onnxruntime's leftovers beside it."""
    peak, params = _peak_between(tmp_path, monkeypatch, ("_apart", 2), "cvm_outputs")
    assert peak < params * 5 // 4, f"{peak / (1 << 20):.1f} MiB for {params >> 20} MiB of params"


def test_the_import_runs_before_onnxruntime_which_runs_before_the_cvm_model(tmp_path, monkeypatch):
    """The import runs first (in its child), so that its refusal comes before onnxruntime runs anything; then the
    comparison's onnxruntime sessions (the float model's holds its float weights), beside nothing of the import
    (its ``Imported`` waits in a file); the CVM model runs alone after them. onnxruntime's failure to run them is
    raised as it is; nothing is written either way."""
    import onnx
    from support.transformers import encoder

    import cvm_onnx.app.quantize as q
    import cvm_onnx.converters.from_onnx as f
    from cvm_onnx.core.errors import RuntimeFailure, UnsupportedError

    onnx.save(encoder(seed=2, s=5, d=8, heads=2, ff=16), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(3, 1, 5, 8)).astype(np.float32))
    said = []
    run_onnx, apart, cvm_outputs = q._run_onnx, q._apart, q.cvm_outputs
    monkeypatch.setattr(q, "_run_onnx", lambda *a, **k: said.append("onnxruntime") or run_onnx(*a, **k))
    monkeypatch.setattr(q, "_apart", lambda fn, src, what, *a: said.append(what) or apart(fn, src, what, *a))
    monkeypatch.setattr(q, "cvm_outputs", lambda *a, **k: said.append("CVM") or cvm_outputs(*a, **k))
    done = q.quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    assert said[:3] == ["importing the quantized model", "onnxruntime", "onnxruntime"] and said[-1] == "CVM"
    samples = np.load(tmp_path / "c.npy")
    assert done.agreements == q.compare(done.float_model, done.onnx_model, done.imported, samples)

    def refused(*a, **k):
        raise UnsupportedError("refused by the import")

    def failed(*a, **k):
        raise RuntimeFailure("onnxruntime failed")

    said.clear()
    monkeypatch.setattr(q, "_run_onnx", failed)
    with pytest.raises(RuntimeFailure, match="onnxruntime failed"):
        q.quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m2")
    assert said == ["importing the quantized model"]
    monkeypatch.setattr(q, "_run_onnx", lambda *a, **k: said.append("onnxruntime") or run_onnx(*a, **k))
    monkeypatch.setattr(f, "import_model", refused)
    said.clear()
    with pytest.raises(UnsupportedError, match="refused by the import"):
        q.quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m3")
    assert said == ["importing the quantized model"]  # onnxruntime never ran
    assert not (tmp_path / "m2").exists() and not (tmp_path / "m3").exists()


def test_in_child_hands_back_its_value_and_relays_its_progress():
    from cvm_onnx.app.memory import in_child

    said = []

    def fn(progress):
        progress(1, 2, "importing")
        progress(2, 2, "importing")
        return {"graph": np.arange(5, dtype=np.int8), "pid": os.getpid()}

    got = in_child(fn, lambda *a: said.append(a))
    assert said == [(1, 2, "importing"), (2, 2, "importing")]
    assert np.array_equal(got["graph"], np.arange(5, dtype=np.int8)) and got["graph"].dtype == np.int8
    assert got["pid"] != os.getpid() or not hasattr(os, "fork")


@pytest.mark.parametrize("kind", ["FormatError", "UnsupportedError", "RuntimeFailure"])
def test_in_child_raises_the_childs_cvm_error_as_it_is(kind):
    from cvm_onnx.app.memory import in_child
    from cvm_onnx.core import errors
    from cvm_onnx.core.errors import Problem

    problems = [Problem("a (Conv)", "no exact form"), Problem("", "a second problem\nover two lines")]

    def fn():
        raise getattr(errors, kind)(problems)

    with pytest.raises(getattr(errors, kind)) as raised:
        in_child(fn)
    assert type(raised.value) is getattr(errors, kind) and raised.value.problems == problems


@pytest.mark.skipif(not hasattr(os, "fork"), reason="a child process where the system forks")
def test_in_child_reports_a_child_ended_by_a_signal():
    import signal

    from cvm_onnx.app.memory import ChildFailed, in_child

    with pytest.raises(ChildFailed, match=r"signal 9 \(SIGKILL\)") as raised:
        in_child(lambda: os.kill(os.getpid(), signal.SIGKILL))
    assert raised.value.signal == signal.SIGKILL


@pytest.mark.skipif(not hasattr(os, "fork"), reason="a child process where the system forks")
def test_in_child_ends_the_child_when_progress_raises():
    """The child would sleep for an hour after its first progress: the exception its relay raises here ends it
    (else the wait for it hangs), and no child is left to reap."""
    import time

    from cvm_onnx.app.memory import in_child

    def fn(progress):
        progress(0, None, "importing")
        time.sleep(3600)

    def progress(*args):
        raise _Stopped

    with pytest.raises(_Stopped):
        in_child(fn, progress)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def _digits_quantized(tmp_path, capsys=None):
    """``cvm-onnx quantize`` of models/digits_cnn into tmp_path/m: its exit status and its stderr's lines."""
    from cvm_onnx.app.cli import main

    models = Path(__file__).resolve().parents[2] / "models" / "digits_cnn"
    code = main(["quantize", str(models / "float.onnx"), "--calibration", str(models / "calibration.npy"), "-o",
                 str(tmp_path / "m")])
    return code, capsys.readouterr().err.splitlines()


def test_quantize_raises_the_imports_error_from_its_child_as_in_process(tmp_path, monkeypatch, capsys):
    """The import runs in a child (``quantize._apart``): its refusal, every problem in it, is raised and
    printed as when it ran in quantize's process, and nothing is written."""
    import cvm_onnx.app.quantize as q
    import cvm_onnx.converters.from_onnx as f
    from cvm_onnx.core.errors import Problem, UnsupportedError

    problems = [Problem("conv1 (Conv)", "no exact form"), Problem("fc (Gemm)", "another rule")]

    def refused(*args, **kwargs):
        raise UnsupportedError(problems)

    monkeypatch.setattr(f, "import_model", refused)
    said = []
    for apart in (True, False):
        if not apart:  # as the import ran before: in this process
            monkeypatch.setattr(q, "in_child", lambda fn, progress=None: fn(progress))
        said.append(_digits_quantized(tmp_path, capsys))
        assert not (tmp_path / "m").exists()
    assert said[0] == said[1] == (4, ["unsupported: conv1 (Conv): no exact form",
                                      "unsupported: fc (Gemm): another rule"])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the import runs in a forked child where the system forks")
def test_quantize_reports_an_import_ended_by_a_signal_in_one_line(tmp_path, monkeypatch, capsys):
    """The import's child killed (as the system does when memory runs out): one line naming the model and the
    signal, exit status 5 (a runtime error), nothing written; no wait for a child that never answers."""
    import signal

    import cvm_onnx.converters.from_onnx as f

    monkeypatch.setattr(f, "import_model", lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL))
    code, err = _digits_quantized(tmp_path, capsys)
    models = Path(__file__).resolve().parents[2] / "models" / "digits_cnn"
    assert (code, err) == (5, [f"runtime error: {models / 'float.onnx'}: importing the quantized model: the child "
                               "process was ended by signal 9 (SIGKILL)"])
    assert not (tmp_path / "m").exists()
