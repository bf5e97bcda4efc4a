"""The chains the exporter writes are on the CPU kernels' fast paths.

The kernels simplify a requantize op's chains, then match them against the step sequences they have compiled
(custom_ops/requantize.h). Python mirrors none of it: ``native.chain_path`` asks the library, which runs the
kernels' own simplification and matchers (custom_ops/chain_path.cc). A chain that no compiled sequence
recognises still computes the same integers, only slower, so no exactness test notices: these tests do.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from functools import cache

import numpy as np
import pytest
from conftest import MODELS, RESNET, ROOT

import cvm_onnx
from cvm_onnx.core.errors import FormatError
from cvm_onnx.core.graph import Graph
from cvm_onnx.native import (ADD, CLIP, COMPILED_KINDS, MUL64, MULTIPLY, RUN_TIME_KINDS, SHIFT, STEP_KINDS,
                             STEP_LOOPS, ChainPath, chain_path, library_path)
from cvm_onnx.serving.routes import chain_paths
from cvm_onnx.serving.target import LAYOUTS, Target

pytestmark = pytest.mark.skipif(library_path() is None, reason="the native custom-op library was not built")


def flat(*steps: tuple[int, int, int]) -> list[int]:
    return [v for s in steps for v in s]


def channels(n: int, *steps: tuple[int, int, int]) -> dict[str, list[int]]:
    """channel_counts and channel_steps of ``n`` channels, channel c's multiplier 3 + c (so none is the same)."""
    per = [flat(*((k, a + c if k == MULTIPLY else a, b) for k, a, b in steps)) for c in range(n)]
    return {"channel_counts": [len(steps)] * n, "channel_steps": [v for p in per for v in p]}


CLIP_U8, CLIP_S8 = (CLIP, 0, 255), (CLIP, -127, 127)


def test_the_path_speeds_are_the_librarys():
    """cvm_onnx.native's path speeds are the probe's PathSpeed enumerators, read from custom_ops/chain_path.cc."""
    (enum,) = re.findall(r"enum\s+PathSpeed\b[^{]*\{([^}]*)\}", (ROOT / "custom_ops" / "chain_path.cc").read_text())
    speeds = {name: int(value) for name, value in re.findall(r"(k\w+)\s*=\s*(\d+)", enum)}
    assert speeds == {"kStepLoops": STEP_LOOPS, "kRunTimeKinds": RUN_TIME_KINDS, "kCompiledKinds": COMPILED_KINDS}


@pytest.mark.parametrize("kind", range(len(STEP_KINDS)))
def test_one_step_is_one_pass_named_as_python_names_its_kind(kind):
    step = {CLIP: (CLIP, 0, 255), MUL64: (MUL64, 5, 1)}.get(kind, (kind, 3, 0))
    assert chain_path({"steps": list(step)}, False, None) == ChainPath(COMPILED_KINDS, f"one pass ({STEP_KINDS[kind]})")


def test_one_list_of_a_compiled_sequence_runs_in_one_pass():
    """clip, multiply, shift, clip is one of requantize.h's CvmChains; two adds are none."""
    assert chain_path({"steps": flat(CLIP_S8, (MULTIPLY, 3, 0), (SHIFT, 4, 0), CLIP_U8)}, False, None).speed == \
        COMPILED_KINDS
    loops = chain_path({"steps": flat((ADD, 3, 0), (ADD, -5, 0))}, False, None)
    assert loops.speed == STEP_LOOPS and loops.text.startswith("step loops")


def test_the_kernels_simplification_comes_first():
    """Steps the kernels drop (a multiply by 1, a shift by 0, a clip holding int32) do not take a chain off its
    path: the library simplifies as the kernels do, which Python does not mirror."""
    steps = flat((MULTIPLY, 1, 0), CLIP_S8, (SHIFT, 0, 0), (MULTIPLY, 3, 0), (SHIFT, 4, 0), CLIP_U8,
                 (CLIP, -(1 << 31), (1 << 31) - 1))
    assert chain_path({"steps": steps}, False, None).speed == COMPILED_KINDS


@pytest.mark.parametrize("n, last, want", [(16, True, COMPILED_KINDS), (32, True, COMPILED_KINDS),
                                           (8, True, RUN_TIME_KINDS), (16, False, STEP_LOOPS)])
def test_channel_chains_take_the_blocks_of_16_channels_last(n, last, want):
    """Each channel's own clip, shift, multiply, shift, clip: 16-channel blocks where the channels are innermost
    and a multiple of 16, else lanes dispatching on the kinds; channels outermost, each chain alone, of a
    sequence CvmChains does not hold."""
    attrs = channels(n, CLIP_S8, (SHIFT, 2, 0), (MULTIPLY, 3, 0), (SHIFT, 4, 0), CLIP_U8)
    assert chain_path(attrs, last, None).speed == want


def test_a_product_in_two_parts_has_its_blocks():
    attrs = channels(16, CLIP_S8, (SHIFT, 2, 0), (MUL64, 3 << 20 | 5, 20), (SHIFT, 4, 0), CLIP_U8)
    assert chain_path(attrs, True, None).speed == COMPILED_KINDS


@pytest.mark.parametrize("addend", ["int32", "uint8"])
def test_a_residual_end_after_blocks_is_compiled(addend):
    """After 16-channel blocks, an addend's multiply and a shift and clip after the sum: with_end's compiled end;
    after one list of steps, the end's kinds are dispatched at run time (AnyEnd)."""
    attrs = {**channels(16, CLIP_S8, (SHIFT, 2, 0), (MULTIPLY, 3, 0), (SHIFT, 4, 0), CLIP_U8),
             "addend_steps": flat((MULTIPLY, 7, 0)), "sum_steps": flat((SHIFT, 3, 0), CLIP_U8)}
    assert chain_path(attrs, True, addend).speed == COMPILED_KINDS
    one = {**attrs, "steps": flat(CLIP_S8, (MULTIPLY, 3, 0), (SHIFT, 4, 0), CLIP_U8), "channel_counts": [],
           "channel_steps": []}
    assert chain_path(one, True, addend).speed == RUN_TIME_KINDS


@pytest.mark.parametrize("attrs", [{"steps": [CLIP, 3]}, {"steps": flat((SHIFT, 40, 0))},
                                   {"channel_counts": [2], "channel_steps": flat(CLIP_U8)},
                                   {"steps": flat((9, 0, 0))}])
def test_chains_the_kernels_refuse_are_an_error(attrs):
    with pytest.raises(FormatError, match="requantize chains"):
        chain_path(attrs, True, None)


# -- every chain the exporter writes ---------------------------------------------------------------------------

ALL = ("rows", "fused", "columns")
STAND_IN = "resnet20 stand-in"  # models/resnet20/make.py's, where the on-chain ResNet-20 is absent
TWO = ("side-by-side two parts",)
SIDE = ("side-by-side one part", *TWO)
#: Chains knowingly off the compiled paths: (models, layouts, a pattern their paths' descriptions match, why). Each
#: must match some chain of each of its models in each of its layouts, so that an entry a new fast path makes
#: stale fails too.
KNOWN = [
    (("detection", STAND_IN), ALL, r"step loops \(multiply > shift > clip\)",
     "a run starting with a multiply (detection's heads, the stand-in's pool), no clip before it: CvmChains' "
     "sequences start with a clip or a shift"),
    (("digits_cnn",), ALL, r"step loops \(add > add\)",
     "two adds in a row (a quantized import's zero points), which the kernels' simplification does not merge"),
    (("digits_cnn",), ALL, r"channel lanes \(.*; 8 channels\)",
     "a convolution of 8 channels: channel_blocks takes rows of 16-channel blocks"),
    (("digits_cnn", *SIDE), ALL, r"per channel: 0 of 10 in one pass \(clip > (shift > multiply|mul64) > shift > "
     r"(clip > )?add > clip\)",
     "the classifier's Gemm: 10 channels, channels outermost, each channel's chain alone: not among CvmChains"),
    (("resnet20",), ALL, r"step loops \(shift > clip > multiply > shift > clip > multiply > multiply > shift\)",
     "the dense's run: two multiplies in a row, which the kernels' simplification does not merge"),
    (("resnet20", STAND_IN), ("rows", "fused"), r"one pass \(.*\), lane end ",
     "a residual end after one list of steps: uniform_chain ends with AnyEnd, the addend's kinds dispatched at run "
     "time (requantize.h compiles ends only after 16-channel blocks)"),
    (("resnet20",), ("columns",), r"step loops \(clip > multiply > shift\)",
     "the columns layout has no residual-end kernel: a residual branch's run before the Add is a requantize of its "
     "own, ending with a shift (CvmChains' end with a clip or a multiply)"),
    (SIDE, ("columns",), r"step loops \((clip > multiply|shift > clip)\)",
     "the columns layout has no residual-end kernel: the Add's operands' runs (clip > multiply) and the run after it "
     "(shift > clip) are requantize nodes of their own"),
]


@cache
def side_by_side() -> dict[str, Graph]:
    """benchmarks/quantized_side_by_side.py's network (its builder), quantized as the script quantizes it (QDQ,
    uint8 activations, int8 weights per channel, MinMax; on tests/support/quantized.py's 4 random samples) and
    imported in one part and in two parts."""
    import tempfile
    from pathlib import Path

    from support.quantized import quantized

    from cvm_onnx.converters.from_onnx import import_model

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("side_by_side", ROOT / "benchmarks" /
                                                      "quantized_side_by_side.py")
        script = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        sys.modules.pop("side_by_side", None)
    with tempfile.TemporaryDirectory() as tmp:
        qm, _ = quantized(script.resnet20(np.random.default_rng(0)), Path(tmp), "QDQ", "uint8", False, True)
    return {f"side-by-side {name}": import_model(qm, two_part=two).graph
            for name, two in (("one part", False), ("two parts", True))}


def models() -> list[str]:
    return [p.name for p in sorted(MODELS.iterdir()) if (p / "symbol").is_file()] + [
        "resnet20", "side-by-side one part", "side-by-side two parts"]


def fixed_layouts() -> list[Target]:
    """Every fixed-layout CPU target of this machine: its operands and ISA (``Target.native``), each layout."""
    here = Target.native()
    return [Target("cpu", "integer", layout, here.operands, here.isa) for layout in LAYOUTS if layout != "session"]


@pytest.mark.parametrize("layout", [t.layout for t in fixed_layouts()])
@pytest.mark.parametrize("name", models())
def test_every_chain_the_exporter_writes_is_on_a_compiled_path(name, layout, request):
    """Every example, ResNet-20 (the on-chain model, else its stand-in) and the side-by-side's quantized network in
    one and two parts, exported for each fixed-layout target of this CPU: each native requantize kernel's chains
    run compiled for their kinds, or are in ``KNOWN`` with the reason."""
    target = next(t for t in fixed_layouts() if t.layout == layout)
    if name == "resnet20":
        graph = cvm_onnx.load(request.getfixturevalue("resnet_dir")).graph
        name = name if (RESNET / "symbol").is_file() else STAND_IN
    else:
        graph = side_by_side()[name] if name.startswith("side") else cvm_onnx.load(MODELS / name).graph
    paths = chain_paths(cvm_onnx.to_onnx(graph, target))
    assert paths or name == "transforms"  # (its ops need no requantization)
    known = [(pattern, why) for models, layouts, pattern, why in KNOWN if name in models and layout in layouts]
    off = {node: p.text for node, p in paths.items() if p.speed != COMPILED_KINDS and not any(
        re.match(pattern, p.text) for pattern, _ in known)}
    assert not off, off
    stale = [why for pattern, why in known if not any(re.match(pattern, p.text) for p in paths.values())]
    assert not stale, stale
