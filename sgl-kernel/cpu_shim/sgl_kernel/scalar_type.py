"""``sgl_kernel.scalar_type``: descriptors of the (quantised) element types of weight kernels.

A :class:`ScalarType` is described by its exponent and mantissa widths, whether it
has a sign bit, an integer ``bias`` (stored value = value + bias, e.g. ``uint4b8``),
and for floats whether it has infinities and how NaN is encoded. ``id`` packs
those fields into one int64 in the layout of the C++ ``ScalarType`` that
upstream's JIT Marlin kernels decode (``sglang/kernels/jit/include/sgl_kernel/scalar_type.hpp``):
exponent 8 bits, mantissa 8, signed 1, bias 32, finite-values-only 1, NaN
representation 8, from the least significant bit up.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union


class NanRepr(enum.IntEnum):
    NONE = 0  # no NaN
    IEEE_754 = 1  # exponent all ones, mantissa not all zeros
    EXTD_RANGE_MAX_MIN = 2  # exponent and mantissa all ones


_ID_FIELDS = (("exponent", 8), ("mantissa", 8), ("signed", 1), ("bias", 32), ("_finite_values_only", 1), ("nan_repr", 8))


@dataclass(frozen=True)
class ScalarType:
    exponent: int  # exponent bits (0 for integers)
    mantissa: int  # mantissa bits; for integers the value bits without the sign bit
    signed: bool
    bias: int  # stored value = value + bias
    _finite_values_only: bool = False
    nan_repr: NanRepr = NanRepr.IEEE_754

    # -- constructors -------------------------------------------------------
    @classmethod
    def int_(cls, size_bits: int, bias: int = 0) -> "ScalarType":
        return cls(0, size_bits - 1, True, bias)

    @classmethod
    def uint(cls, size_bits: int, bias: int = 0) -> "ScalarType":
        return cls(0, size_bits, False, bias)

    @classmethod
    def float_IEEE754(cls, exponent: int, mantissa: int) -> "ScalarType":
        assert exponent > 0 and mantissa > 0
        return cls(exponent, mantissa, True, 0, False, NanRepr.IEEE_754)

    @classmethod
    def float_(cls, exponent: int, mantissa: int, finite_values_only: bool, nan_repr: NanRepr) -> "ScalarType":
        assert exponent > 0 and mantissa > 0 and nan_repr != NanRepr.IEEE_754
        return cls(exponent, mantissa, True, 0, finite_values_only, NanRepr(nan_repr))

    @classmethod
    def from_id(cls, scalar_id: int) -> "ScalarType":
        values = {}
        offset = 0
        for name, bits in _ID_FIELDS:
            raw = (scalar_id >> offset) & ((1 << bits) - 1)
            if name == "bias" and raw >= 1 << 31:
                raw -= 1 << 32
            values[name] = raw
            offset += bits
        return cls(
            values["exponent"],
            values["mantissa"],
            bool(values["signed"]),
            values["bias"],
            bool(values["_finite_values_only"]),
            NanRepr(values["nan_repr"]),
        )

    # -- properties ---------------------------------------------------------
    @property
    def size_bits(self) -> int:
        return self.exponent + self.mantissa + int(self.signed)

    @property
    def id(self) -> int:
        packed = 0
        offset = 0
        for name, bits in _ID_FIELDS:
            packed |= (int(getattr(self, name)) & ((1 << bits) - 1)) << offset
            offset += bits
        return packed

    def is_floating_point(self) -> bool:
        return self.exponent != 0

    def is_integer(self) -> bool:
        return self.exponent == 0

    def is_signed(self) -> bool:
        return self.signed

    def has_bias(self) -> bool:
        return self.bias != 0

    def has_infs(self) -> bool:
        return self.is_floating_point() and not self._finite_values_only

    def has_nans(self) -> bool:
        return self.is_floating_point() and self.nan_repr != NanRepr.NONE

    def is_ieee_754(self) -> bool:
        return self.is_floating_point() and self.nan_repr == NanRepr.IEEE_754 and not self._finite_values_only

    # -- range ----------------------------------------------------------------
    def _float_max(self) -> float:
        exp_bias = (1 << (self.exponent - 1)) - 1
        all_ones_exp = (1 << self.exponent) - 1
        all_ones_man = (1 << self.mantissa) - 1
        if self.nan_repr == NanRepr.IEEE_754:
            exp_field, man_field = all_ones_exp - 1, all_ones_man  # all-ones exponent is inf/NaN
        elif self.nan_repr == NanRepr.EXTD_RANGE_MAX_MIN:
            if self.mantissa > 0:
                exp_field, man_field = all_ones_exp, all_ones_man - 1  # all ones is NaN
            else:
                exp_field, man_field = all_ones_exp - 1, 0
        else:
            exp_field, man_field = all_ones_exp, all_ones_man
        return 2.0 ** (exp_field - exp_bias) * (1.0 + man_field / (1 << self.mantissa))

    def max(self) -> Union[int, float]:
        """Largest finite representable value (after removing ``bias``)."""
        if self.is_floating_point():
            return self._float_max()
        return (1 << self.mantissa) - 1 - self.bias

    def min(self) -> Union[int, float]:
        """Smallest finite representable value (after removing ``bias``)."""
        if self.is_floating_point():
            if self.signed:
                return -self._float_max()
            exp_bias = (1 << (self.exponent - 1)) - 1
            return 0.0 if self.mantissa else 2.0 ** (-exp_bias)
        return (-(1 << self.mantissa) if self.signed else 0) - self.bias

    # -- names ------------------------------------------------------------------
    def __str__(self) -> str:
        if self.is_floating_point():
            name = f"float{self.size_bits}_e{self.exponent}m{self.mantissa}"
            if not self.is_ieee_754():
                if self._finite_values_only:
                    name += "f"
                if self.nan_repr == NanRepr.EXTD_RANGE_MAX_MIN:
                    name += "n"
            if not self.signed:
                name += "u"
            return name
        name = ("int" if self.signed else "uint") + str(self.size_bits)
        if self.has_bias():
            name += f"b{self.bias}"
        return name

    def __repr__(self) -> str:
        return f"ScalarType.{self}"


class scalar_types:
    """The named types (fields equal to the C++ constants of the same names)."""

    int4 = ScalarType.int_(4)
    uint4 = ScalarType.uint(4)
    int8 = ScalarType.int_(8)
    uint8 = ScalarType.uint(8)
    float8_e4m3fn = ScalarType.float_(4, 3, True, NanRepr.EXTD_RANGE_MAX_MIN)
    float8_e5m2 = ScalarType.float_IEEE754(5, 2)
    float8_e8m0fnu = ScalarType(8, 0, False, 0, True, NanRepr.EXTD_RANGE_MAX_MIN)
    float16_e8m7 = ScalarType.float_IEEE754(8, 7)
    float16_e5m10 = ScalarType.float_IEEE754(5, 10)
    float6_e3m2f = ScalarType.float_(3, 2, True, NanRepr.NONE)
    float6_e2m3f = ScalarType.float_(2, 3, True, NanRepr.NONE)
    float4_e2m1f = ScalarType.float_(2, 1, True, NanRepr.NONE)
    # integers with a bias (GPTQ style)
    uint2b2 = ScalarType.uint(2, 2)
    uint3b4 = ScalarType.uint(3, 4)
    uint4b8 = ScalarType.uint(4, 8)
    uint8b128 = ScalarType.uint(8, 128)
    # common aliases
    bfloat16 = float16_e8m7
    float16 = float16_e5m10
