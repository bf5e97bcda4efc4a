"""The progress of a long import names its stage (issue 35): ``quantize`` reports preparing, calibrating, quantizing,
importing (node groups counted to their total), validating, onnxruntime's runs and comparing (its samples counted),
in that order; the bar shows a stage of unknown length by its name alone."""
from __future__ import annotations

import numpy as np
import onnx
from support.transformers import encoder

from cvm_onnx.app.quantize import quantize


def test_quantize_names_each_stage_in_order(tmp_path):
    said = []
    onnx.save(encoder(seed=2, s=5, d=8, heads=2, ff=16), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(3, 1, 5, 8)).astype(np.float32))
    quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", progress=lambda *a: said.append(a))
    stages = [w for i, (_, _, w) in enumerate(said) if i == 0 or said[i - 1][2] != w]
    assert stages == ["preparing the float model (onnxruntime)", "calibrating", "quantizing (onnxruntime)",
                      "importing", "validating", "running the float and quantized models (onnxruntime)",
                      "comparing with the float model", "samples"]
    importing = [(d, t) for d, t, w in said if w == "importing"]
    total = importing[0][1]
    assert [d for d, _ in importing] == list(range(1, total + 1)) and {t for _, t in importing} == {total}
    assert [(d, t) for d, t, w in said if w in ("preparing the float model (onnxruntime)", "validating",
                                                 "running the float and quantized models (onnxruntime)",
                                                 "comparing with the float model")] == [(0, None)] * 4


def test_the_bar_shows_a_stage_of_unknown_length_by_its_name_alone():
    from rich.progress import MofNCompleteColumn

    from cvm_onnx.app.progress import Bar

    bar = Bar()
    [count] = [c for c in bar._bar.columns if isinstance(c, MofNCompleteColumn)]
    bar(2, 5, "calibrating")
    bar(0, None, "quantizing")
    [task] = bar._bar.tasks
    assert (task.description, str(count.render(task))) == ("quantizing", "")
    bar(3, 7, "importing")
    [task] = bar._bar.tasks
    assert (task.description, str(count.render(task))) == ("importing", "3/7")
