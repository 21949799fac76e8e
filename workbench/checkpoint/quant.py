"""Quantization: per-module mode / bits / group size, inferred from tensor shapes and
checked against config.json's ``quantization`` block (with per-path overrides).

MLX layouts (``mx.quantize``):

* ``affine``: uint32 packed weight [.., out, in*bits/32], scales and biases [.., out, in/gs]
  in the float dtype; 2..8 bits, any group size;
* ``mxfp4`` (4 bits, group 32), ``mxfp8`` (8 bits, group 32): uint8 scales, no biases;
* ``nvfp4`` (4 bits, group 16): uint8 scales, no biases.
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench.checkpoint.names import split_name

#: fixed (bits, group_size) of the microscaling modes
MX_MODES = {"mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}
AFFINE_BITS = (2, 3, 4, 5, 6, 8)


@dataclass(frozen=True)
class QuantSpec:
    mode: str
    bits: int
    group_size: int

    def __str__(self) -> str:
        return f"{self.mode} {self.bits}-bit g{self.group_size}"

    @property
    def has_biases(self) -> bool:
        return self.mode == "affine"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "bits": self.bits, "group_size": self.group_size}

    def packed_shape(self, shape: tuple) -> tuple:
        """Shape of the uint32 weight for a float weight of ``shape``."""
        return tuple(shape[:-1]) + (shape[-1] * self.bits // 32,)

    def scales_shape(self, shape: tuple) -> tuple:
        return tuple(shape[:-1]) + (shape[-1] // self.group_size,)

    def fits(self, in_dim: int) -> bool:
        return in_dim % self.group_size == 0 and (in_dim * self.bits) % 32 == 0


def mode_of(bits: int, group_size: int, uint8_scales: bool) -> str | None:
    if not uint8_scales:
        return "affine" if bits in AFFINE_BITS else None
    for m, (b, g) in MX_MODES.items():
        if (b, g) == (bits, group_size):
            return m
    return None


def infer(weight_shape, scales_shape, scales_dtype: str, in_dim: int | None = None,
          hint: QuantSpec | None = None) -> QuantSpec | None:
    """Infer the spec a packed weight was made with; None when the shapes admit none.

    With ``in_dim`` (the float weight's input width, known from the architecture) the
    answer is exact; without it, ``hint`` (the config's spec) is tried first, then the
    usual bit widths."""
    if not weight_shape or not scales_shape:
        return None
    packed, ngroups = weight_shape[-1], scales_shape[-1]
    if packed <= 0 or ngroups <= 0:
        return None
    u8 = scales_dtype == "U8"
    if in_dim:
        if (packed * 32) % in_dim or in_dim % ngroups:
            return None
        bits, gs = packed * 32 // in_dim, in_dim // ngroups
        m = mode_of(bits, gs, u8)
        return QuantSpec(m, bits, gs) if m else None
    cands = ([hint.bits] if hint else []) + [b for b in (4, 8, 2, 3, 5, 6) if not hint or b != hint.bits]
    for bits in cands:
        if (packed * 32) % bits:
            continue
        ind = packed * 32 // bits
        if ind % ngroups:
            continue
        gs = ind // ngroups
        m = mode_of(bits, gs, u8)
        if m and gs in (16, 32, 64, 128):
            return QuantSpec(m, bits, gs)
    return None


def spec_from_dict(d) -> QuantSpec | None:
    if not isinstance(d, dict):
        return None
    try:
        bits, gs = int(d["bits"]), int(d["group_size"])
    except (KeyError, TypeError, ValueError):
        return None
    return QuantSpec(str(d.get("mode", "affine")), bits, gs)


class QuantConfig:
    """config.json's ``quantization`` (or ``quantization_config``) block."""

    def __init__(self, config: dict | None):
        config = config if isinstance(config, dict) else {}
        block = config.get("quantization")
        if not isinstance(block, dict):
            block = config.get("quantization_config")
        if not isinstance(block, dict):
            tc = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
            block = tc.get("quantization") if isinstance(tc.get("quantization"), dict) else None
        self.block = block
        self.default = spec_from_dict(block) if block else None
        self.overrides: dict[str, QuantSpec | None] = {}  # canonical module -> spec (None = kept float)
        self.global_scale: set[str] = set()  # modules whose override asks for an nvfp4 global scale
        self.override_keys: dict[str, str] = {}  # canonical module -> key as in config
        if block:
            for k, v in block.items():
                if k in ("group_size", "bits", "mode", "quant_method", "global_scale"):
                    continue
                if isinstance(v, dict) or v is False:
                    comp, bare, _ = split_name(k + ".weight")
                    mod = bare[: -len(".weight")]
                    self.overrides[mod] = spec_from_dict(v) if v is not False else None
                    self.override_keys[mod] = k
                    if isinstance(v, dict) and v.get("global_scale"):
                        self.global_scale.add(mod)

    @property
    def present(self) -> bool:
        return self.block is not None

    def expected(self, module: str) -> QuantSpec | None:
        if module in self.overrides:
            return self.overrides[module]
        return self.default

    def to_dict(self) -> dict | None:
        if not self.block:
            return None
        return {"default": self.default.to_dict() if self.default else None,
                "overrides": {self.override_keys[m]: (s.to_dict() if s else None) for m, s in self.overrides.items()}}
