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
    assert "has no onnxruntime_cxx_api.h" in message
    assert "CVM_ONNX_ORT_INCLUDE_DIR" in message and "CVM_ONNX_NATIVE=OFF" in message


@needs_cmake
def test_native_off_builds_without_the_library_and_says_so(tmp_path):
    done = configure(tmp_path, CVM_ONNX_ORT_INCLUDE_DIR=str(tmp_path / "nowhere"), CVM_ONNX_NATIVE="OFF")
    assert done.returncode == 0, done.stderr
    assert "the native custom-op library is NOT built (CVM_ONNX_NATIVE=OFF)" in " ".join(done.stderr.split())


def test_pip_builds_the_library_in_a_folder_that_a_new_build_environment_keeps(tmp_path):
    """pip's build isolation makes scikit-build-core delete its project's CMakeCache.txt and CMakeFiles/ (the
    objects) on every install: the project it runs (custom_ops/wheel) builds custom_ops/ in native/ instead, passing
    the options on and the library's errors and warnings through."""
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]
    assert settings["cmake"]["source-dir"] == "custom_ops/wheel"
    if shutil.which("cmake") is None:
        pytest.skip("no cmake on PATH")
    build = tmp_path / "build"

    def configure(*args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["cmake", "-S", ROOT / "custom_ops" / "wheel", "-B", build, "-DCVM_ONNX_CUDA=OFF", *args],
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=300)

    done = configure("-DCVM_ONNX_NATIVE=OFF", CVM_ONNX_ORT_INCLUDE_DIR=str(tmp_path / "nowhere"))
    assert done.returncode == 0, done.stderr
    assert "the native custom-op library is NOT built (CVM_ONNX_NATIVE=OFF)" in " ".join(done.stderr.split())
    assert (build / "native" / "CMakeCache.txt").is_file()
    shutil.rmtree(build / "CMakeFiles")  # what scikit-build-core does in a new build environment
    (build / "CMakeCache.txt").unlink()
    done = configure(CVM_ONNX_ORT_INCLUDE_DIR=str(tmp_path / "nowhere"))  # the option's default (ON) again
    assert done.returncode != 0 and (build / "native" / "CMakeFiles").is_dir()
    message = " ".join(done.stderr.split())
    assert "the native custom-op library cannot be built" in message and "has no onnxruntime_cxx_api.h" in message


def test_pip_shows_what_to_do_after_a_failed_build():
    """The message scikit-build-core prints after a failed build (shown by pip) names the way out."""
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]
    assert "CVM_ONNX_NATIVE=OFF" in settings["messages"]["after-failure"]


CUDA_ARCHITECTURES = ("80", "90")  # A100 and H100: what custom_ops/CMakeLists.txt builds by default


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH (the CUDA kernels are then not built)")
def test_the_cuda_kernels_compile_for_sm80_and_sm90_without_warnings(tmp_path):
    """nvcc -c of cvm_ops_cuda.cu (no link, no GPU needed) for each architecture the build targets, every warning an
    error: what `pip install` with CVM_ONNX_CUDA=ON compiles."""
    arch = [a for v in CUDA_ARCHITECTURES for a in ("--generate-code", f"arch=compute_{v},code=sm_{v}")]
    done = subprocess.run(["nvcc", "-c", "-std=c++17", "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror",
                           *arch, "-o", str(tmp_path / "kernels.o"), str(ROOT / "custom_ops" / "cvm_ops_cuda.cu")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if shutil.which("cuobjdump"):  # where the toolkit has it: each architecture's code is in the object
        listed = subprocess.run(["cuobjdump", "--list-elf", str(tmp_path / "kernels.o")], capture_output=True,
                                text=True)
        assert all(f"sm_{v}" in listed.stdout for v in CUDA_ARCHITECTURES), listed.stdout


def test_the_build_targets_the_architectures_the_compile_test_checks():
    text = (ROOT / "custom_ops" / "CMakeLists.txt").read_text()
    assert f'set(CMAKE_CUDA_ARCHITECTURES "{";".join(CUDA_ARCHITECTURES)}")' in text
