"""What every kernel config provides, and the value sets and integer codes the configs share.

A config is a frozen dataclass of compile-time parameters. Its class says which archs it is compiled for and
which kernel class builds it on each arch (`kernels`: arch -> "module:function", imported only by the build,
so this package stays pure Python), and which of its fields identify the variant (`key_fields`). The build
writes those fields into the kernel table as named integers (`key`), which the C++ handlers read back to check
buffers against the variant they were asked to run (csrc/common.h, `Param`).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any, ClassVar

ARCHS = ("sm_90a", "sm_100f")
"""Every arch the library is built for. Blackwell (sm_100f) cubins are built and checked statically, never run
on this project's machines."""

ARCH_CCS: dict[str, tuple[tuple[int, int], ...]] = {"sm_90a": ((9, 0),), "sm_100f": ((10, 0), (10, 3))}
"""The compute capabilities whose devices load each arch's cubins: an "a" target only its own (sm_90a: H100,
H200), the family target sm_100f every member of the sm_100 family (10.0: B200, GB200; 10.3: B300, GB300).
The kernel table stores these per row; the handlers pick the row whose list holds the device's cc."""

ARCH_MAJOR = {arch: ccs[0][0] for arch, ccs in ARCH_CCS.items()}
ARCH_PACKAGE = {"sm_90a": "sm90", "sm_100f": "sm100"}
"""The package under jax_mxfp8/kernels/ that names each arch's kernels."""

UNSUPPORTED_CCS: dict[int, str] = {
    12: (
        "consumer Blackwell (sm_120: GeForce RTX 50, RTX PRO Blackwell) is not supported: it has no tensor memory "
        "and no tcgen05 block-scaled MMA, so the sm_100f cubins do not load there and the library has no sm_120 "
        "kernels; every op runs its XLA reference"
    ),
}
"""Compute-capability majors with a known reason why no kernel of this library runs there."""


def arch_for_cc(cc: tuple[int, int]) -> str | None:
    """The arch whose cubins load on a device of compute capability `cc` (major, minor), or None."""
    return next((arch for arch, ccs in ARCH_CCS.items() if tuple(cc) in ccs), None)


def cc_name(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"

IN_DTYPES = ("bfloat16", "float32")
ELEM_DTYPES = ("float8_e4m3fn", "float8_e5m2")
SCALE_ROUNDINGS = ("up", "floor")
QUANTIZE_MODES = ("rowcol", "row", "col", "square")
DEQUANTIZE_BLOCKS = ("row", "col", "square")
DEQUANTIZE_OUT_DTYPES = ("bfloat16", "float32", "float16")
P_SCALES = ("const", "block")

# Integer codes of string-valued key fields, shared with csrc/common.h (DTypeCode, ModeCode): the handlers
# compare a variant's codes with the dtypes of the buffers they get.
DTYPE_CODE = {"bfloat16": 0, "float32": 1, "float8_e4m3fn": 2, "float8_e5m2": 3, "float16": 4}
MODE_CODE = {"rowcol": 0, "row": 1, "col": 2, "square": 3}
ROUNDING_CODE = {"up": 0, "floor": 1}
P_SCALE_CODE = {"const": 0, "block": 1}

SHORT = {"bfloat16": "bf16", "float32": "f32", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float16": "f16"}
"""Short dtype names used in variant names."""


def every_arch(function: str, module: str = "quantize") -> dict[str, str]:
    """`kernels` of a config built on every arch in ARCHS by `function` of kernels/<arch>/<module>.py (which
    names an arch-neutral kernels/common/ class today, and a Blackwell-specific one where it comes to differ)."""
    return {arch: f"jax_mxfp8.kernels.{ARCH_PACKAGE[arch]}.{module}:{function}" for arch in ARCHS}


class KernelConfig:
    """The interface the build tool, the kernel table and `registry.find` use; subclasses are frozen dataclasses.

    Class attributes every subclass sets:
      op: the op family, also the op name in the kernel table (a handler refuses a variant of another op).
      kernels: arch -> "module:function" of the callable that builds the kernel object for a config on that
        arch (kernels/<arch>/...); `archs` is its key tuple, the archs the config is compiled for.
      key_fields: the fields that, with `tune`, identify a variant; they are written into the table as named
        integers (`key`) for the handlers to check.
      codes: field -> {value: integer} for the string-valued key fields (bools and ints are written as is).
    Optional:
      table_fields: fields written into the table as well (after `tune`) that are not lookup keys: schedule
        choices a handler must know about (e.g. which operands the kernel takes), default none.
    """

    op: ClassVar[str]
    kernels: ClassVar[Mapping[str, str]]
    archs: ClassVar[tuple[str, ...]]
    key_fields: ClassVar[tuple[str, ...]]
    codes: ClassVar[Mapping[str, Mapping[str, int]]] = {}
    table_fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # `archs` is derived, so the two can never disagree
        cls.archs = tuple(cls.kernels)
        unknown = set(cls.archs) - set(ARCHS)
        if unknown:
            raise ValueError(f"{cls.__name__}.kernels names archs {sorted(unknown)} not in {ARCHS}")

    @property
    def name(self) -> str:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    @property
    def tune(self) -> int:
        """0 for the production variant of its key; > 0 for the comparison schedules (benchmarks). Subclasses with
        tunings declare `tune` as a field, which replaces this property."""
        return 0

    @property
    def key(self) -> dict[str, int]:
        """The kernel table's named integer parameters: the key fields (encoded by `codes`), `tune` and the
        table_fields."""
        out = {}
        for field in (*self.key_fields, "tune", *self.table_fields):
            value = getattr(self, field)
            out[field] = int(self.codes[field][value]) if field in self.codes else int(value)
        return out

    @property
    def max_cols(self) -> int:
        """The largest number of columns the variant supports (checked by the handler); 0 = no limit."""
        return 0

    def kernel_factory(self, arch: str) -> str:
        """The "module:function" that builds this config's kernel on `arch`."""
        if arch not in self.kernels:
            raise ValueError(f"{self.name} is not compiled for {arch} (only {', '.join(self.archs)})")
        return self.kernels[arch]

    def make_kernel(self, arch: str) -> Any:
        """The kernel object for `arch` (imports the CuTe DSL: build tool only)."""
        module, _, function = self.kernel_factory(arch).partition(":")
        return getattr(importlib.import_module(module), function)(self)

    @classmethod
    def key_defaults(cls) -> dict[str, Any]:
        """The constructor defaults of the key fields and of `tune` (what `registry.find` assumes when a field is
        not given)."""
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return {field: defaults.get(field, 0) for field in (*cls.key_fields, "tune")}
