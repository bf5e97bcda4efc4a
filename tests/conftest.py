"""Shared fixtures: ResNet-20 and the model directories the tests convert.

The on-chain ResNet-20 (CIFAR) lives outside the project, at ``../shared/models/resnet20-cifar`` from its root (or
where CVM_RESNET20 says); the project never ships a copy. Where it is absent, the tests take the stand-in of the
same shapes that models/resnet20/make.py generates (once per session); a test of the runtime's own published
output needs the on-chain model and is skipped, saying where it looked.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# sympy, once per test process: quantize runs the symbolic shape inference in forked children, which inherit it
import onnxruntime.tools.symbolic_shape_infer  # noqa: F401
import pytest

import cvm_onnx
from cvm_onnx.core.graph import Graph

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
_spec = importlib.util.spec_from_file_location("make_resnet20", MODELS / "resnet20" / "make.py")
make_resnet20 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_resnet20)
RESNET = make_resnet20.ONCHAIN  # the on-chain model's directory, for lists made at collection (it may be absent)


@pytest.fixture(scope="session", autouse=True)
def route_cache_here(tmp_path_factory: pytest.TempPathFactory):
    """The route cache (serving.route_cache) in this test session's temporary directory, never the user's."""
    before = os.environ.get("CVM_ONNX_CACHE_DIR")
    os.environ["CVM_ONNX_CACHE_DIR"] = str(tmp_path_factory.mktemp("route-cache"))
    yield
    if before is None:
        del os.environ["CVM_ONNX_CACHE_DIR"]
    else:
        os.environ["CVM_ONNX_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def onchain_resnet_dir() -> Path:
    """The on-chain ResNet-20 model directory (symbol, params, input.npy, expected.npy: the runtime's output)."""
    if not (make_resnet20.ONCHAIN / "symbol").is_file():
        pytest.skip(f"the on-chain ResNet-20 model is absent ({make_resnet20.ONCHAIN})")
    return make_resnet20.ONCHAIN


@pytest.fixture(scope="session")
def resnet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ResNet-20 model directory (symbol, params, input.npy, expected.npy): the on-chain one where it is here,
    else the generated stand-in (its expected.npy the reference executor's output)."""
    return make_resnet20.resnet20(tmp_path_factory.getbasetemp() / "resnet20")


@pytest.fixture
def resnet(resnet_dir: Path) -> Graph:
    """ResNet-20 (``resnet_dir``), loaded and validated (a fresh graph for each test)."""
    return cvm_onnx.load(resnet_dir).graph


@pytest.fixture
def model_dir(request: pytest.FixtureRequest) -> Path:
    """A model directory named by an indirect parameter: an example of models/, or ``resnet20``."""
    return request.getfixturevalue("resnet_dir") if request.param == "resnet20" else MODELS / request.param
