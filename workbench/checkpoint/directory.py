"""Which files make a checkpoint, and what config.json and the index say, before any header
is read: :class:`CheckpointError` (the path cannot be used), :class:`Problem` (what opening
found), :func:`read_config`, :func:`discover` (the shard files, from the index or the
directory; names that escape it refused) and :func:`check_index` (the index against the
shards' headers).  The reader (reader.py) opens the checkpoint through these."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from workbench.checkpoint import names as N
from workbench.errors import printable
from workbench.fsio import MAX_CONFIG, MAX_INDEX, InputFileError, read_bytes

INDEX_NAME = "model.safetensors.index.json"


class CheckpointError(Exception):
    """The path cannot be used as a checkpoint (or a tensor cannot be read); the message
    names the file, tensor and byte offset where known."""


@dataclass
class Problem:
    code: str
    severity: str
    message: str
    tensor: str | None = None
    file: str | None = None
    layer: int | None = None
    suggestion: str | None = None

    def to_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "message": self.message, "tensor": self.tensor,
                "file": self.file, "layer": self.layer, "suggestion": self.suggestion}


def inside(root: Path, rel: str) -> bool:
    """Lexical containment (symlinks inside the directory are allowed, as in the HF cache)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel or os.path.isabs(rel):
        return False
    norm = os.path.normpath(rel)
    return not (norm == ".." or norm.startswith("../") or norm.startswith("/") or norm == ".")


def json_type(v) -> str:
    return {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}.get(type(v), "value")


def read_config(root: Path, problems: list) -> tuple[dict, bool]:
    """config.json as a dict and whether one was read; a missing, unparseable or non-object
    config is a bad-config problem (an empty dict), one that cannot be read at all a
    CheckpointError."""
    cp = root / "config.json"
    if not os.path.lexists(cp):
        problems.append(Problem("bad-config", "error",
                                f"no config.json in {root.name or root}: completeness "
                                "cannot be checked, and workbench.load cannot build a model without it",
                                file="config.json"))
        return {}, False
    try:  # a config we cannot read at all (FIFO, device, permissions, over the cap) is unusable input
        raw = read_bytes(cp, MAX_CONFIG, str(cp))
    except InputFileError as e:
        raise CheckpointError(str(e)) from None
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        msg = f"config.json is not valid JSON: {e.msg} at byte {e.pos}" if isinstance(e, json.JSONDecodeError) \
            else f"config.json cannot be parsed: {type(e).__name__}"
        problems.append(Problem("bad-config", "error", msg, file="config.json"))
        return {}, False
    if not isinstance(cfg, dict):
        problems.append(Problem("bad-config", "error", "config.json is not a JSON object",
                                file="config.json"))
        return {}, False
    for where, d in (("model_type", cfg), ("text_config.model_type", cfg.get("text_config"))):
        mt = d.get("model_type") if isinstance(d, dict) else None
        if mt is not None and not isinstance(mt, str):
            raise CheckpointError(f"{cp}: {where} is {json.dumps(mt)[:60]} (a JSON {json_type(mt)}), "
                                  "not a string")
    return cfg, True


def discover(root: Path, problems: list) -> tuple[list[str], dict | None, dict[str, list[str]]]:
    """The shard files to read (the index's, or every model*.safetensors), the index as read
    (``weight_map``, ``escaped``: the names mapped outside the directory or to no file name,
    ``metadata``; None without one) and the shards it names that are missing -> their tensors."""
    # every non-directory entry: a FIFO or device among them is refused by name when opened
    on_disk = sorted(e.name for e in os.scandir(root) if e.name.endswith(".safetensors")
                     and not e.is_dir())
    model_files = [f for f in on_disk if f.startswith("model")] or on_disk
    ip = root / INDEX_NAME
    if not os.path.lexists(ip):
        if not model_files:
            raise CheckpointError(f"{root}: no .safetensors files and no {INDEX_NAME}")
        return model_files, None, {}
    try:
        raw = read_bytes(ip, MAX_INDEX, INDEX_NAME)
        idx = json.loads(raw.decode("utf-8"))
        if not isinstance(idx, dict) or not isinstance(idx.get("weight_map"), dict):
            raise ValueError("no weight_map object")
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        msg = f"{e.msg} at byte {e.pos}" if isinstance(e, json.JSONDecodeError) else \
            (type(e).__name__ if isinstance(e, RecursionError) else str(e))
        problems.append(Problem("index-mismatch", "error", f"{INDEX_NAME} cannot be used ({msg}); "
                                "reading the shard files found on disk instead", file=INDEX_NAME))
        if not model_files:
            raise CheckpointError(f"{root}: {INDEX_NAME} is unusable and no .safetensors files exist")
        return model_files, None, {}
    wm = {}
    escaped = {}
    invalid = {}
    for name, f in idx["weight_map"].items():
        if not isinstance(f, str) or not f.strip() or "\x00" in f:
            invalid.setdefault(repr(f)[:60], []).append(name)
            continue
        if not inside(root, f):
            escaped.setdefault(str(f), []).append(name)
            continue
        wm[name] = os.path.normpath(f)
    for f, ns in escaped.items():
        problems.append(Problem("path-escape", "error",
                                f"{INDEX_NAME} maps {len(ns)} tensor(s) (first {ns[0]!r}) to {f!r}, "
                                "outside the checkpoint directory: refused, not opened",
                                tensor=ns[0], file=INDEX_NAME, layer=N.layer_of(ns[0])))
    for f, ns in invalid.items():
        problems.append(Problem("index-mismatch", "error",
                                f"{INDEX_NAME} maps {len(ns)} tensor(s) (first {ns[0]!r}) to {f}, "
                                "which is not a file name", tensor=ns[0], file=INDEX_NAME,
                                layer=N.layer_of(ns[0])))
        escaped.setdefault(f, []).extend(ns)  # known names, not "unlisted"
    index = {"weight_map": wm, "escaped": escaped, "metadata": idx.get("metadata")}
    files = []
    missing: dict[str, list[str]] = {}
    by_file: dict[str, list[str]] = {}  # one pass over the index (linear in its size)
    for n, g in wm.items():
        by_file.setdefault(g, []).append(n)
    for f, ns in by_file.items():
        if os.path.lexists(root / f) and not os.path.isdir(root / f):
            files.append(f)  # (a FIFO, device or unreadable file is refused by name when opened)
        else:
            missing[f] = ns
            what = "is a directory" if os.path.isdir(root / f) else "does not exist"
            problems.append(Problem("missing-shard", "error",
                                    f"shard {f} named in {INDEX_NAME} for {len(ns)} tensor(s) "
                                    f"(first {ns[0]!r}) {what}", tensor=ns[0], file=f))
    listed = set(files)
    for f in model_files:
        if f not in listed and f not in missing:
            problems.append(Problem("index-mismatch", "warning",
                                    f"{f} is in the directory but not named in {INDEX_NAME}; "
                                    "its tensors are read too (mlx-lm loads every model*.safetensors)",
                                    file=f))
            files.append(f)
    if not files and not missing:
        outside = [f for f in escaped if f not in invalid]
        if outside or invalid:  # say why: each file it names is outside the directory, or no file name
            first, what = (repr(outside[0]), "escapes the checkpoint directory") if outside else \
                (next(iter(invalid)), "is not a file name")
            more = len(outside or invalid) - 1
            raise CheckpointError(f"{root}: {INDEX_NAME} names no shard file inside the directory: "
                                  f"{printable(first)[:200]} {what} (refused, not opened)"
                                  + (f"; {more} more like it" if more else ""))
        raise CheckpointError(f"{root}: {INDEX_NAME} names no shard files")
    return files, index, missing


def check_index(index: dict | None, missing: dict, sfiles: dict, where: dict, tensors: dict, problems: list) -> None:
    """The index against the shards' headers: every name it maps is in that shard, every
    tensor a shard holds is listed (index-mismatch problems otherwise)."""
    if index is None:
        return
    wm = index["weight_map"]
    for name, f in wm.items():
        if f in missing:
            continue
        sf = sfiles.get(f)
        if sf is None or not sf.readable:
            continue
        if name not in sf.tensors:
            held = where.get(name)
            found = f"it is in {held_at(sfiles, name, held)}" if held else "no shard holds it"
            problems.append(Problem("index-mismatch", "error",
                                    f"{INDEX_NAME} maps {name!r} to {f}, but {f}'s header has no such "
                                    f"tensor ({found})", tensor=name, file=f, layer=N.layer_of(name)))
    escaped = {n for ns in index["escaped"].values() for n in ns}
    for name, fs in where.items():
        if name not in wm and name not in escaped:
            problems.append(Problem("index-mismatch", "error",
                                    f"{fs[0]} holds {name!r} (byte {tensors[name].offset}), "
                                    f"which {INDEX_NAME} does not list",
                                    tensor=name, file=fs[0], layer=N.layer_of(name)))


def held_at(sfiles: dict, name: str, files) -> str:
    """'a.safetensors (byte 123), b.safetensors (byte 456)'"""
    out = []
    for f in files:
        t = sfiles[f].tensors.get(name)
        out.append(f"{f} (byte {sfiles[f].abs_offset(t)})" if t is not None else f)
    return ", ".join(out)
