"""Engine adapters: a real engine's tensor names and layouts -> our op names, as data.

Each adapter is a JSON file here (``transformers.json``, ``llama_cpp.json``): rules matched
against the whole engine name, first match wins, each naming the op (``\\1``: a group;
``\\L1``: a group lowercased; ``""``: dropped on purpose, with ``why``; a list: a name the
engine gives several nodes, compared with each op of the list the program has and kept
where it fits best, :func:`workbench.diff.engine_glue.choose`), optionally only
``when`` an op is in the reference's program or ``unless`` it is; plus layout notes the
diff applies (llama.cpp's per-head Q/K row permutation, its padded key axis).

>>> adapter = engines.load("transformers")
>>> eng, info = adapter.apply(eng, order, family="llama", head_dim=16)

``workbench diff PATH DUMP --engine transformers|llama.cpp`` applies one; a dump written by
:func:`workbench.diff.torch_hooks` or read from llama-eval-callback's text names its engine
itself, so ``--engine`` may be left out for them.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
#: adapter names the CLI accepts -> data file
NAMES = {"transformers": "transformers.json", "torch": "transformers.json", "hf": "transformers.json",
         "llama.cpp": "llama_cpp.json", "llama_cpp": "llama_cpp.json", "llamacpp": "llama_cpp.json",
         "ggml": "llama_cpp.json"}
_GROUP = re.compile(r"\\(L?)(\d)")


class EngineError(ValueError):
    """An unknown adapter name (unusable input)."""


@dataclass
class Adapter:
    name: str
    strip: str
    rules: list[dict]
    permuted: dict = field(default_factory=dict)
    key_cut: str | None = None
    #: the engine may keep only the output rows (the last token) of an op: compare those there
    output_rows: bool = False

    def _expand(self, rep: str, m: re.Match) -> str:
        return _GROUP.sub(lambda g: (m.group(int(g.group(2))) or "").lower() if g.group(1)
                          else (m.group(int(g.group(2))) or ""), rep)

    def op_for(self, name: str, ops: set) -> tuple[str | list | None, str | None]:
        """(our op, why) for one engine name: an op name, "" (dropped: why says why), None (no
        rule), or the list of ops of ours it may be (those in ``ops``; one of them: that op)."""
        base = re.sub(self.strip, "", name, count=1) if self.strip else name
        for r in self.rules:
            m = r["_rx"].fullmatch(base)
            if not m:
                continue
            if "when" in r and self._expand(r["when"], m) not in ops:
                continue
            if "unless" in r and self._expand(r["unless"], m) in ops:
                continue
            if isinstance(r["op"], list):
                cands = [c for c in (self._expand(o, m) for o in r["op"]) if c in ops]
                return (cands[0] if len(cands) == 1 else cands or None), r.get("why")
            return self._expand(r["op"], m), r.get("why")
        return None, None

    def apply(self, eng: Mapping[str, np.ndarray], order: Sequence[str], family: str | None = None,
              head_dim: int | None = None, known: Mapping[str, np.ndarray] | None = None):
        """Rename ``eng``'s tensors to our ops (and put their layouts in ours where the adapter
        says how).  Returns (the renamed mapping: op -> array, unmatched names kept as they are;
        info): info["engine_names"] op -> engine name, info["dropped"] {engine name: why},
        info["unmatched"] engine names no rule knows, info["known"] the printed-element masks
        under the new names, info["notes"] op -> the layout step taken, info["alternatives"]
        op -> the ops a name of several nodes may be (held under the first free one until
        :func:`workbench.diff.engine_glue.choose` picks)."""
        ops = set(order)
        out: dict = {}
        info = {"engine_names": {}, "dropped": {}, "unmatched": [], "known": {}, "notes": {}, "alternatives": {}}
        later = []  # (a name of several nodes waits for the names of one node to take theirs)
        perm_rx = re.compile(self.permuted["ops"]) if self.permuted and family in self.permuted.get("families", ()) else None
        for en, v in eng.items():
            op, why = self.op_for(en, ops)
            if isinstance(op, list):
                later.append((en, v, op))
                continue
            if op is None or (op and op not in ops):
                if en in info["engine_names"]:  # a matched tensor holds our op of this name
                    info["dropped"][en] = f"no rule; its name is our op {en!r}, which {info['engine_names'][en]!r} gives"
                    continue
                info["unmatched"].append(en)
                out[en] = v
                if known is not None and en in known:
                    info["known"][en] = known[en]
                continue
            if op == "":
                info["dropped"][en] = why or "no op of ours"
                continue
            if op in info["engine_names"]:  # two engine tensors for one op: keep the first, say so
                info["dropped"][en] = f"the same op as {info['engine_names'][op]!r} ({op})"
                continue
            if op in out:  # an unmatched engine tensor of our op's name (llama.cpp's final "norm"): this one wins
                info["unmatched"].remove(op)
                info["known"].pop(op, None)
                info["dropped"][op] = f"no rule; its name is our op {op!r}, which {en!r} gives"
            k = None if known is None else known.get(en)
            if perm_rx is not None and head_dim and perm_rx.match(op) and v.shape[-1] % head_dim == 0:
                v = unpermute_rope_rows(v, head_dim)
                k = None if k is None else unpermute_rope_rows(k, head_dim)
                info["notes"][op] = f"rows put back from GGUF's per-head rope permutation (head_dim {head_dim})"
            out[op] = v
            if k is not None:
                info["known"][op] = k
            info["engine_names"][op] = en
        for en, v, cands in later:
            free = [c for c in cands if c not in info["engine_names"] and c not in out]
            if not free:
                info["dropped"][en] = f"the ops it may be ({', '.join(cands)}) have their own tensors"
                continue
            k = None if known is None else known.get(en)
            if perm_rx is not None and head_dim and all(perm_rx.match(c) for c in free) and v.shape[-1] % head_dim == 0:
                v = unpermute_rope_rows(v, head_dim)
                k = None if k is None else unpermute_rope_rows(k, head_dim)
                info["notes"][free[0]] = f"rows put back from GGUF's per-head rope permutation (head_dim {head_dim})"
            out[free[0]] = v
            info["engine_names"][free[0]] = en
            if k is not None:
                info["known"][free[0]] = k
            if len(free) > 1:
                info["alternatives"][free[0]] = free
        return out, info

    def cuts_keys(self, op: str) -> bool:
        return bool(self.key_cut) and re.match(self.key_cut, op) is not None


def unpermute_rope_rows(v: np.ndarray, head_dim: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's per-head permutation of Q/K rows (llama's interleaved rope):
    GGUF row 2i+j of a head is HF row j*d/2+i."""
    sh = v.shape
    return np.ascontiguousarray(v.reshape(sh[:-1] + (-1, head_dim // 2, 2)).swapaxes(-1, -2).reshape(sh))


def cut_keys(eng: np.ndarray, ref_shape, known: np.ndarray | None = None):
    """An attention-probability tensor whose key axis holds the cache's n_kv (padded) cells:
    the first S (ours), when the cells cut are all zero (never attended).  (array, known, note) or None."""
    S = ref_shape[-1]
    if eng.ndim < 1 or eng.shape[-1] <= S or eng.size // eng.shape[-1] != math.prod(int(n) for n in ref_shape[:-1]):
        return None
    rest = eng[..., S:]
    ok = rest[np.isfinite(rest)] if known is None else rest[known[..., S:] & np.isfinite(rest)]
    if ok.size and np.abs(ok).max() > 1e-6:
        return None
    note = f"key axis cut from the engine's {eng.shape[-1]} cache cells to our {S} (the rest are 0)"
    return eng[..., :S], (None if known is None else known[..., :S]), note


def load(name: str) -> Adapter:
    """The adapter called ``name`` (transformers, llama.cpp)."""
    key = str(name).strip().lower()
    if key not in NAMES:
        raise EngineError(f"--engine {name!r}: no such engine adapter (known: transformers, llama.cpp)")
    data = json.loads((HERE / NAMES[key]).read_text())
    rules = []
    for r in data["rules"]:
        r = dict(r)
        r["_rx"] = re.compile(r["match"])
        rules.append(r)
    return Adapter(name=data["engine"], strip=data.get("strip", ""), rules=rules,
                   permuted=data.get("permuted_rope_rows") or {}, key_cut=data.get("key_axis_cut"),
                   output_rows=bool(data.get("output_rows_last")))


def known_engines() -> list[str]:
    return ["transformers", "llama.cpp"]
