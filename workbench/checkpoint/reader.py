"""The checkpoint reader: header-only open, canonical names, lazy tensor access.

>>> ck = open_checkpoint("path/to/model")          # doctest: +SKIP
>>> ck.lm_names()[:2], ck.info("norm.weight"), ck.load("norm.weight")

Opening reads config.json, the index and every shard's header, nothing else (which files,
and what config.json and the index say: directory.py).
``load`` returns a lazy ``mx.array`` (MLX reads the bytes from the file when the
array is evaluated).  Problems met while opening (bad headers, missing shards, index
disagreements, ...) are collected in ``ck.problems``; only a path that cannot be read
as a checkpoint at all raises :class:`CheckpointError`.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from workbench.checkpoint import names as N
from workbench.checkpoint.arch import Arch, ConfigError, build_arch, family_of, text_config
from workbench.checkpoint.quant import QuantConfig, QuantSpec, infer
from workbench.checkpoint.directory import (INDEX_NAME, CheckpointError, Problem,  # noqa: F401  (re-exported)
                                            check_index, discover, held_at, read_config)
from workbench.checkpoint.sfile import SafetensorsFile
from workbench.fsio import InputFileError, check_regular, kind_of

MAX_TOKENIZER = 200_000_000  # (the largest real ones are ~35 MB)


@dataclass(frozen=True)
class TensorInfo:
    name: str            # canonical name (LM) or the checkpoint name (other components)
    dtype: str
    shape: tuple
    file: str            # file name relative to the checkpoint directory
    offset: int          # absolute byte offset of the (source) tensor data in the file
    nbytes: int
    source_name: str     # name as stored in the checkpoint
    part: str | None = None      # "gate" / "up": a half of a fused HF experts.gate_up_proj
    component: str = "language_model"


class Checkpoint:
    """An opened checkpoint. See module docstring."""

    def __init__(self, path, *, _files=None):
        p = Path(path)
        self.path = p
        self.problems: list[Problem] = []
        self.index: dict | None = None
        self.files: list[str] = []
        self.sfiles: dict[str, SafetensorsFile] = {}
        self._mx_cache: dict[str, dict] = {}
        self._missing_shards: dict[str, list[str]] = {}
        if not os.path.lexists(p):
            raise CheckpointError(f"{p}: no such file or directory")
        try:
            st = os.stat(p)
        except OSError as e:
            raise CheckpointError(f"{p}: cannot be read ({e.strerror or e})") from None
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise CheckpointError(f"{p} is {kind_of(st.st_mode)}, not a checkpoint directory or file: refused")
        if stat.S_ISREG(st.st_mode) and p.name.endswith(".index.json"):  # pointing at the index: the directory
            p = p.parent
            self.path = p
            st = os.stat(p)
        if stat.S_ISREG(st.st_mode):
            if not p.name.endswith(".safetensors"):
                raise CheckpointError(f"{p}: not a directory or a .safetensors file")
            self.root = p.parent
            single = p.name
        else:
            self.root = p
            single = None
        self.config, self.config_present = read_config(self.root, self.problems)
        if single:
            self.files = [single]
        else:
            self.files, self.index, self._missing_shards = discover(self.root, self.problems)
        for f in self.files:
            sf = SafetensorsFile.parse(str(self.root / f))
            if sf.unreadable:  # a file we cannot open is unusable input, not a list of "missing" tensors
                raise CheckpointError(sf.unreadable)
            self.sfiles[f] = sf
            for q in sf.problems:
                self.problems.append(Problem(q["code"], q["severity"], q["message"], q["tensor"], f,
                                             N.layer_of(q["tensor"]) if q["tensor"] else None))
        self._build_tables()
        check_index(self.index, self._missing_shards, self.sfiles, self.where, self.tensors, self.problems)
        self.quant_config = QuantConfig(self.config)
        self._arch = None
        self._arch_error = None

    # ---------------------------------------------------------------- opening
    def _build_tables(self):
        self.tensors: dict[str, TensorInfo] = {}   # source name -> info
        self.where: dict[str, list[str]] = {}       # source name -> files holding it
        splits = {}
        for f in self.files:
            sf = self.sfiles[f]
            for t in sf.tensors.values():
                self.where.setdefault(t.name, []).append(f)
                if t.name in self.tensors:
                    continue
                split = N.split_name(t.name)
                splits[t.name] = split
                comp = split[0]
                self.tensors[t.name] = TensorInfo(t.name, t.dtype, t.shape, f, sf.abs_offset(t), t.end - t.begin,
                                                  t.name, None, comp)
        for n, fs in self.where.items():
            if len(fs) > 1:
                self.problems.append(Problem("duplicate-tensor", "error",
                                             f"tensor {n!r} is stored in {len(fs)} files: "
                                             f"{held_at(self.sfiles, n, fs)}",
                                             tensor=n, file=fs[1], layer=N.layer_of(n)))
        self.components: dict[str, int] = {}
        self._canon: dict[str, TensorInfo] = {}
        self._canon_src: dict[str, list[str]] = {}
        layouts = set()
        for n, ti in self.tensors.items():
            self.components[ti.component] = self.components.get(ti.component, 0) + 1
            split = splits[n]
            comp, bare, layout = split
            if comp != "language_model":
                continue
            if layout != "any":
                layouts.add(layout)
            if n.endswith((".experts.gate_up_proj", ".experts.down_proj")):
                layouts.add("hf")
            for cn, part in N.canonical(n, split):
                self._canon_src.setdefault(cn, []).append(n)
                if cn in self._canon:
                    continue
                shape, nbytes = ti.shape, ti.nbytes
                if part and len(shape) >= 2:
                    shape = tuple(shape[:-2]) + (shape[-2] // 2, shape[-1])
                    nbytes = ti.nbytes // 2
                self._canon[cn] = TensorInfo(cn, ti.dtype, shape, ti.file, ti.offset, nbytes, n, part, comp)
        for cn, srcs in self._canon_src.items():
            if len(srcs) > 1:
                self.problems.append(Problem("duplicate-tensor", "error",
                                             f"{cn} is provided by {len(srcs)} checkpoint tensors under different "
                                             f"name layouts: {', '.join(srcs)}", tensor=srcs[1],
                                             file=self.tensors[srcs[1]].file, layer=N.layer_of(cn)))
        self.layout = "hf" if layouts == {"hf"} else ("mixed" if len(layouts) > 1 else "mlx")
        if self.layout == "hf" and family_of(self.config) == "gemma3n" and not any(
                n.endswith(".gate_up_proj") for n in self.tensors):
            self.layout = "mlx"  # Gemma 3n: mlx-lm keeps the Hugging Face names (model.language_model.*)
        tp = self.root / "tokenizer.json"
        self.tokenizer_path, self.tokenizer_error, self._tokenizer = None, None, None
        if os.path.lexists(tp):  # a regular file of bounded size only (it is read whole when loaded)
            try:
                size = check_regular(tp, "tokenizer.json").st_size
                if size > MAX_TOKENIZER:
                    raise InputFileError(f"tokenizer.json is {size} bytes, over the {MAX_TOKENIZER // 10**6} MB "
                                         "limit: refused")
                self.tokenizer_path = tp
            except InputFileError as e:
                self.tokenizer_error = str(e)
                self.problems.append(Problem("bad-config", "warning", str(e), file="tokenizer.json"))

    def tokenizer(self):
        """tokenizer.json as the ``tokenizers`` library reads it (parsed once, as loading and
        inspect both read it), or None: none there, refused when opened, or unparseable --
        then ``tokenizer_error`` says why in one line naming the file."""
        if self._tokenizer is None and self.tokenizer_path is not None and self.tokenizer_error is None:
            from tokenizers import Tokenizer
            try:
                self._tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
            except Exception as e:  # noqa: BLE001 - the library raises a bare Exception for a bad file
                msg = " ".join(str(e).split())[:200] or type(e).__name__
                self.tokenizer_error = f"tokenizer.json cannot be read by the tokenizers library: {msg}"
        return self._tokenizer

    # ------------------------------------------------------------- properties
    @property
    def text_config(self) -> dict:
        return text_config(self.config)

    @property
    def config_model_type(self) -> str | None:
        return self.config.get("model_type")

    @property
    def model_type(self) -> str:
        """Text model family: gemma4_text | gemma3_text | qwen3 | llama (| gemma3n)."""
        fam = family_of(self.config)
        if fam:
            return fam
        mt = self.config.get("model_type")
        return str(mt) if mt else "unknown"

    @property
    def arch(self) -> Arch | None:
        """Expected tensors from config.json, or None (see ``arch_error``)."""
        if self._arch is None and self._arch_error is None:
            try:
                self._arch = build_arch(self.config) if self.config_present else None
                if self._arch is None:
                    self._arch_error = "no usable config.json"
            except ConfigError as e:
                self._arch_error = str(e)
        return self._arch

    @property
    def arch_error(self) -> str | None:
        self.arch
        return self._arch_error

    @property
    def num_layers(self) -> int:
        a = self.arch
        if a:
            return a.num_layers
        n = self.text_config.get("num_hidden_layers")
        if isinstance(n, int) and not isinstance(n, bool):
            return n
        ls = [N.layer_of(c) for c in self._canon]
        ls = [x for x in ls if x is not None]
        return max(ls) + 1 if ls else 0

    # ---------------------------------------------------------------- access
    @property
    def canonical(self) -> Mapping[str, TensorInfo]:
        """Canonical language-model name -> TensorInfo (read-only; fused Hugging Face experts
        appear as their halves, each with its ``part``)."""
        return MappingProxyType(self._canon)

    @property
    def missing_shards(self) -> Mapping[str, list[str]]:
        """Shard files named in the index that are absent (or directories) -> the tensor names
        the index maps to them (read-only; empty without an index)."""
        return MappingProxyType(self._missing_shards)

    def lm_names(self) -> list[str]:
        """Sorted canonical language-model tensor names (prefix-stripped, MLX style)."""
        return sorted(n for n in self._canon if not N.is_ignored(n))

    def source_names(self, component: str | None = None) -> list[str]:
        """Tensor names exactly as stored, optionally only one component's."""
        return sorted(n for n, t in self.tensors.items() if component is None or t.component == component)

    def info(self, name: str) -> TensorInfo:
        """TensorInfo by canonical LM name, or by the name as stored."""
        t = self._canon.get(name) or self.tensors.get(name)
        if t is None:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        return t

    def __contains__(self, name: str) -> bool:
        return name in self._canon or name in self.tensors

    def load(self, name: str, keep: bool = True):
        """The tensor as an ``mx.array``, lazy: MLX reads it from the file when evaluated.
        Raises CheckpointError (naming file, tensor and byte offset) if it cannot be read.

        ``keep=False``: the reader keeps no reference to the array, so its memory is freed
        when the caller drops it (streamed weights: :mod:`workbench.models.streaming`); a
        later load of the same tensor reads the file again."""
        import mlx.core as mx

        t = self.info(name)
        sf = self.sfiles[t.file]
        raw = sf.tensors.get(t.source_name)
        where = f"{t.file}: tensor {t.source_name!r} at byte {t.offset}"
        if raw is None or t.source_name in sf.truncated:
            raise CheckpointError(f"{where}: data lies past the end of the file ({sf.size} bytes)")
        arr = None
        # mx.load reads F64 as float32 and has no FP8: those (and files with header problems) take the numpy path
        if raw.dtype not in ("F64", "F8_E4M3", "F8_E5M2", "F8_E8M0") and not any(p["severity"] == "error" for p in sf.problems):
            try:
                d = self._mx_cache.get(t.file)
                if d is None or t.source_name not in d:  # (not kept: taken out of the dict below)
                    d = mx.load(sf.path)
                    self._mx_cache[t.file] = d
                arr = d[t.source_name] if keep else d.pop(t.source_name)
            except Exception:  # noqa: BLE001 - fall back to the checked numpy path below
                arr = None
        if arr is None:
            try:
                a = sf.read_numpy(t.source_name)
            except (ValueError, OSError) as e:
                raise CheckpointError(f"{where}: {e}") from None
            if raw.dtype in ("F8_E4M3", "F8_E5M2", "F8_E8M0"):  # decoded to float32
                from workbench.checkpoint.values import to_float

                a = to_float(a.tobytes(), raw.dtype).reshape(a.shape)
            arr = mx.array(a, dtype=mx.float64) if raw.dtype == "F64" else mx.array(a)
            if raw.dtype == "BF16":
                arr = arr.view(mx.bfloat16)
        if t.part:
            half = arr.shape[-2] // 2
            arr = arr[..., :half, :] if t.part == "gate" else arr[..., half:, :]
        return arr

    def load_rows(self, name: str, rows):
        """Rows ``rows`` (a sorted, unique, in-range integer sequence) of a table, read from
        the file alone (embedding lookups of a streamed model), as an evaluated ``mx.array``
        [len(rows), ...]; a tensor that cannot be read by rows (a fused half, FP8, F64)
        is loaded whole and indexed.  Raises CheckpointError like :meth:`load`."""
        import mlx.core as mx
        import numpy as np

        t = self.info(name)
        sf = self.sfiles[t.file]
        rows = np.asarray(rows, dtype=np.int64)
        if t.part or t.dtype in ("F64", "F8_E4M3", "F8_E5M2", "F8_E8M0") or \
                any(p["severity"] == "error" for p in sf.problems):
            return self.load(name, keep=False)[mx.array(rows)]
        try:
            a = sf.read_rows(t.source_name, rows)
        except (ValueError, OSError) as e:
            raise CheckpointError(f"{t.file}: tensor {t.source_name!r} at byte {t.offset}: {e}") from None
        arr = mx.array(a)
        return arr.view(mx.bfloat16) if t.dtype == "BF16" else arr

    def quant_of(self, module_path: str) -> QuantSpec | None:
        """The quantization of a module (``layers.3.self_attn.q_proj``), inferred from its
        tensors' shapes; None when it is stored unquantized (or cannot be inferred)."""
        w = self._canon.get(module_path + ".weight")
        s = self._canon.get(module_path + ".scales")
        if w is None or s is None:
            return None
        in_dim = None
        a = self.arch
        if a is not None:
            e = a.expected.get(module_path + ".weight")
            if e is not None:
                in_dim = e.shape[-1]
        return infer(w.shape, s.shape, s.dtype, in_dim, self.quant_config.expected(module_path))

    def close(self):
        self._mx_cache.clear()

    def __repr__(self):
        return (f"<Checkpoint {self.path} {self.model_type} layers={self.num_layers} "
                f"tensors={len(self.tensors)} files={len(self.files)}>")


def open_checkpoint(path) -> Checkpoint:
    """Open a checkpoint directory (config.json + model.safetensors or shards + index) or a
    single .safetensors file. Reads headers only."""
    try:
        return Checkpoint(path)
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(f"{path}: {e.strerror or e}") from None
