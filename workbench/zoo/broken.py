"""The zoo's broken variants: each name in BROKEN, the inspector's problem code it must
produce, and the edits that plant it (in the tensors, the shard index, or the written files).

``stored_as`` maps a canonical name to its stored name; ``target_layer`` is the layer the breakages hit."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from workbench import fsio
from workbench.zoo.writer import to_entry

#: broken variant -> problem code the inspector must report
BROKEN = {
    "missing-tensor": "missing-tensor",        # a layer's q_proj is gone
    "misnamed": "unexpected-tensor",           # mlp.down_proj stored as mlp.down_prj (+ missing-tensor)
    "unexpected-tensor": "unexpected-tensor",  # an extra tensor no architecture uses
    "shape-mismatch": "shape-mismatch",        # mlp.gate_proj stored transposed (quantized: a row short)
    "dtype-mismatch": "dtype-mismatch",        # a norm weight stored as int32
    "quantization-mismatch": "quantization-mismatch",  # one module packed with other bits than config says
    "duplicate-tensor": "duplicate-tensor",    # one tensor in two shards
    "missing-shard": "missing-shard",          # a shard named by the index is deleted
    "index-mismatch": "index-mismatch",        # the index maps a tensor to the wrong shard
    "truncated-file": "truncated-file",        # the last shard loses its tail
    "bad-header": "bad-header",                # header JSON garbled
    "header-too-large": "bad-header",          # header length field past the 100 MB cap
    "overlapping-offsets": "bad-header",       # two tensors' data_offsets overlap
    "path-escape": "path-escape",              # the index names ../outside.safetensors
    "nonfinite-values": "nonfinite-values",    # NaN, +Inf, -Inf written into a norm weight
    "bad-config": "bad-config",                # config.json lacks num_hidden_layers
}


def break_entries(entries: dict, broken, stored_as, target_layer):
    def pop_module(mod):
        out = {}
        for suf in (".weight", ".scales", ".biases"):
            k = stored_as(mod + suf)
            if k in entries:
                out[suf] = entries.pop(k)
        return out

    if "missing-tensor" in broken:
        pop_module(f"layers.{target_layer}.self_attn.q_proj")
    if "misnamed" in broken:
        for suf, v in pop_module(f"layers.{target_layer}.mlp.down_proj").items():
            entries[stored_as(f"layers.{target_layer}.mlp.down_prj") + suf] = v
    if "unexpected-tensor" in broken:
        entries[stored_as(f"layers.{target_layer}.self_attn.attn_logit_bias")] = to_entry(np.zeros((4,), np.float32))
    if "shape-mismatch" in broken:
        k = stored_as(f"layers.{target_layer}.mlp.gate_proj.weight")
        dt, shp, data = entries[k]
        if dt != "U32":
            arr = np.frombuffer(data, {"BF16": np.uint16, "F16": np.uint16, "F32": np.float32}[dt]).reshape(shp)
            arr = arr.T.copy()
            entries[k] = (dt, arr.shape, arr.tobytes())
        else:  # quantized: drop the last output row of the packed weight
            arr = np.frombuffer(data, np.uint32).reshape(shp)[:-1].copy()
            entries[k] = ("U32", arr.shape, arr.tobytes())
    if "dtype-mismatch" in broken:
        k = stored_as(f"layers.{target_layer}.input_layernorm.weight")
        dt, shp, data = entries[k]
        entries[k] = to_entry(np.ones(shp, np.int32))
    if "nonfinite-values" in broken:
        k = stored_as(f"layers.{target_layer}.post_attention_layernorm.weight")
        dt, shp, data = entries[k]
        if dt == "BF16":
            arr = np.frombuffer(data, np.uint16).copy()
            arr[0], arr[1], arr[2], arr[3] = 0x7FC0, 0x7F80, 0xFF80, 0x7FC0  # NaN, +Inf, -Inf, NaN
        else:
            arr = np.frombuffer(data, {"F32": np.float32, "F16": np.float16}[dt]).copy()
            arr[:4] = [np.nan, np.inf, -np.inf, np.nan]
        entries[k] = (dt, shp, arr.tobytes())


def break_index(weight_map: dict, files: list, broken, stored_as, target_layer):
    """The index breakages: a tensor mapped to the wrong shard, a shard path outside the folder."""
    if "index-mismatch" in broken:
        k = stored_as(f"layers.{target_layer}.self_attn.o_proj.weight")
        weight_map[k] = files[-1] if weight_map[k] != files[-1] else files[0]
    if "path-escape" in broken:
        weight_map[stored_as("norm.weight")] = "../outside.safetensors"  # (the zoo writes nothing outside dest)


def break_files(dest: Path, files: list, broken):
    if "missing-shard" in broken:
        os.remove(dest / files[-1])
    if "truncated-file" in broken:
        p = dest / files[-1]
        size = p.stat().st_size
        with open(p, "r+b") as f:
            f.truncate(size - max(64, size // 10))
    if "bad-header" in broken:
        p = dest / files[0]
        b = bytearray(p.read_bytes())
        b[8 + 1: 8 + 6] = b"!!!!!"  # garble the first key
        fsio.write_bytes(p, bytes(b))
    if "header-too-large" in broken:
        p = dest / files[0]
        with open(p, "r+b") as f:
            f.write(struct.pack("<Q", 200_000_000))
    if "overlapping-offsets" in broken:
        p = dest / files[0]
        raw = p.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        hdr = json.loads(raw[8: 8 + n])
        ts = sorted((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][0])
        a_, b_ = hdr[ts[0]], hdr[ts[1]]
        ln = b_["data_offsets"][1] - b_["data_offsets"][0]
        b_["data_offsets"] = [a_["data_offsets"][0], a_["data_offsets"][0] + ln]
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * (n - len(h)) if len(h) <= n else b""
        h2 = h if len(h) == n else h + b" " * ((8 - len(h) % 8) % 8)
        fsio.write_bytes(p, struct.pack("<Q", len(h2)) + h2 + raw[8 + n:])
