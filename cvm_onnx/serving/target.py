"""The target of a serving form: one value, decided once, that every route choice of the export reads.

A ``Target`` says which provider runs the model, whether convolutions take the native library's exact integer
products, where the CPU's one-group integer products run (``layout``), as which operand types (``operands``),
and the kernels' ISA the choice was made for. An export is a function of the CVM graph and its Target alone:
the same Target gives the same bytes on any machine, and the model states its Target in metadata ``cvm.target``.

``Target.default(provider)`` is the portable form (``--optimize``, ``--provider cuda``): integer products where
the native library is built, the rows left as exported for the session to lay out (layout "session"), uint8 x
uint8 operands (exact on every CPU). ``Target.native()`` is this machine's best (``--target native``): the
layout and operands fixed at export from the CPU's features (CPUID through the native library, and
onnxruntime's products probed: ``native.cpu``), so that plain onnxruntime runs the file as ``cvm-onnx run`` does;
``convert --target native`` replaces its layout by the one measured fastest for the model here (``route_cache``).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import onnx

from cvm_onnx.core.constants import TARGET
from cvm_onnx.core.errors import FormatError, UnsupportedError
from cvm_onnx.native import library_path

from .cpu_layout import LAYOUTS, OPERANDS

PROVIDERS = ("cpu", "cuda")
#: "integer": a convolution's products exact in integers (the native im2col and requantize kernels); "float":
#: float32 Conv where that is exact, no serving kernel (runs without the native library).
PRODUCTS = ("integer", "float")
#: The fused kernels' products ISA a CPU target was chosen for (custom_ops/conv.h picks its own at run time);
#: "any": not chosen for one CPU.
ISAS = ("any", "baseline", "avx2", "avx_vnni", "avx512_vnni")
#: The kernels' ISAs a CPU's features (native.cpu.features) may name, the best first (else "baseline").
_BEST_FIRST = ("avx512_vnni", "avx_vnni", "avx2")
#: The ISAs whose fused kernels multiply with VNNI: the fused layout measured fastest (benchmarks/bench.py).
VNNI = ("avx512_vnni", "avx_vnni")
#: The layout each ISA's CPU gets before any measurement: fused with VNNI (measured); on AVX2 fused too (its AVX2
#: kernels, timed on a VNNI CPU, beat the rows of uint8 x uint8 products; an AVX2-only CPU is not measured); rows on
#: the baseline (not measured). A session of a layout-"session" model, and ``convert --target native``, take the
#: layout measured fastest for the model here instead (``route_cache``).
LAYOUT_OF_ISA = {"avx512_vnni": "fused", "avx_vnni": "fused", "avx2": "fused", "baseline": "rows"}
#: The names ``--target`` takes.
NAMES = ("cpu", "cuda", "native")


@dataclass(frozen=True)
class Target:
    """What a serving form is made for; ``UnsupportedError`` for a value outside its field's choices."""

    provider: str = "cpu"
    products: str = "integer"
    layout: str = "session"
    operands: str = "u8u8"
    isa: str = "any"

    def __post_init__(self) -> None:
        for field, value, choices in (("provider", self.provider, PROVIDERS), ("products", self.products, PRODUCTS),
                                      ("layout", self.layout, LAYOUTS), ("operands", self.operands, OPERANDS),
                                      ("isa", self.isa, ISAS)):
            if value not in choices:
                raise UnsupportedError(f"target {field} {value!r}: choose one of {', '.join(choices)}")
        if not self.cpu_integer and (self.layout, self.operands, self.isa) != ("session", "u8u8", "any"):
            raise UnsupportedError(f"target layout {self.layout!r}, operands {self.operands!r} and isa {self.isa!r}: "
                                   "only a CPU target with integer products has a layout, operands or ISA to choose")

    @property
    def cpu_integer(self) -> bool:
        """Whether the CPU's integer-products routes (rows, columns, fused; exact integer operands) are taken."""
        return self.provider == "cpu" and self.products == "integer"

    @property
    def needs_library(self) -> bool:
        """Whether the model runs the native library's serving kernels (they have no fallback)."""
        return self.products == "integer"

    @classmethod
    def default(cls, provider: str = "cpu") -> Target:
        """The portable target of ``provider``: integer products where the native library is built (always for
        CUDA), the layout left to the session."""
        return cls(provider, "integer" if provider == "cuda" or library_path() is not None else "float")

    @classmethod
    def native(cls) -> Target:
        """This machine's best CPU target: its kernels' ISA, that ISA's layout (``LAYOUT_OF_ISA``; for one model,
        the app's ``--target native`` takes the layout measured for it, ``runtime.sessions.layout_choice``) and the
        widest operands onnxruntime computes exactly here; float products without the native library."""
        from cvm_onnx.native import cpu  # onnxruntime, probed: only when this machine's target is asked for

        if library_path() is None:
            return cls("cpu", "float")
        features = set(cpu.features())
        isa = next((isa for isa in _BEST_FIRST if isa in features), "baseline")
        operands = "u8s8" if cpu.unbounded() else "u8s8-rows0" if cpu.products() == "u8s8" else "u8u8"
        return cls("cpu", "integer", LAYOUT_OF_ISA[isa], operands, isa)

    @classmethod
    def named(cls, name: str) -> Target:
        """The target ``--target`` names: "cpu" or "cuda" (``default``), "native" (``native``)."""
        if name not in NAMES:
            raise UnsupportedError(f"target {name!r}: choose one of {', '.join(NAMES)}")
        return cls.native() if name == "native" else cls.default(name)

    def text(self) -> str:
        """The metadata value stating this target (JSON, keys sorted)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> Target | None:
        """The target ``model``'s metadata states, or None (not a serving form, or one made before targets)."""
        text = next((p.value for p in model.metadata_props if p.key == TARGET), None)
        if text is None:
            return None
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError, UnsupportedError) as e:
            raise FormatError(f"metadata {TARGET}={text!r} is not a target ({e})") from None
