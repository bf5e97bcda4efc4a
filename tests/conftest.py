"""Shared fixtures: the shared ResNet-20 and the model directories the tests convert.

The ResNet-20 (CIFAR) model lives outside the project, at ``../shared/models/resnet20-cifar`` from its root; the
project never ships a copy. A test that needs it is skipped, saying where it looked, when it is absent.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import cvm_onnx
from cvm_onnx.core.graph import Graph

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
RESNET = ROOT.parent / "shared" / "models" / "resnet20-cifar"


@pytest.fixture(scope="session")
def resnet_dir() -> Path:
    """The shared ResNet-20 model directory (symbol, params, input.npy, expected.npy)."""
    if not (RESNET / "symbol").is_file():
        pytest.skip(f"the shared ResNet-20 model is absent ({RESNET})")
    return RESNET


@pytest.fixture
def resnet(resnet_dir: Path) -> Graph:
    """The shared ResNet-20, loaded and validated (a fresh graph for each test)."""
    return cvm_onnx.load(resnet_dir).graph


@pytest.fixture
def model_dir(request: pytest.FixtureRequest) -> Path:
    """A model directory named by an indirect parameter: an example of models/, or ``resnet20``."""
    return request.getfixturevalue("resnet_dir") if request.param == "resnet20" else MODELS / request.param
