"""The native library never vanishes silently: pip shows a build's output only when the build fails, so CMake
fails, saying why and how to fix it, when the library is required (the default) and cannot be built; with
CVM_ONNX_NATIVE=OFF the package builds without it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake on PATH")


def configure(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """CMake's configure step of custom_ops/ as the build runs it, without CUDA (faster), in a fresh directory."""
    build = tmp_path / f"build{len(list(tmp_path.iterdir()))}"
    return subprocess.run(["cmake", "-S", ROOT / "custom_ops", "-B", build, "-DCVM_ONNX_CUDA=OFF"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


@needs_cmake
def test_missing_headers_fail_the_build_saying_how_to_fix_it(tmp_path):
    done = configure(tmp_path, CVM_ONNX_ORT_INCLUDE_DIR=str(tmp_path / "nowhere"))
    message = " ".join(done.stderr.split())
    assert done.returncode != 0
    assert "the native custom-op library cannot be built" in message
    assert "has no onnxruntime_lite_custom_op.h" in message
    assert "CVM_ONNX_ORT_INCLUDE_DIR" in message and "CVM_ONNX_NATIVE=OFF" in message


@needs_cmake
def test_native_off_builds_without_the_library_and_says_so(tmp_path):
    done = configure(tmp_path, CVM_ONNX_ORT_INCLUDE_DIR=str(tmp_path / "nowhere"), CVM_ONNX_NATIVE="OFF")
    assert done.returncode == 0, done.stderr
    assert "the native custom-op library is NOT built (CVM_ONNX_NATIVE=OFF)" in " ".join(done.stderr.split())


def test_pip_shows_what_to_do_after_a_failed_build():
    """The message scikit-build-core prints after a failed build (shown by pip) names the way out."""
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]
    assert "CVM_ONNX_NATIVE=OFF" in settings["messages"]["after-failure"]
