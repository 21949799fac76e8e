"""Record every module output of a transformers (PyTorch) model into a dump the diff reads.

>>> with workbench.diff.torch_hooks(model) as rec:
...     model(torch.tensor([ids]))
>>> rec.save("engine.safetensors", ids=ids)

torch is imported only here (it is no dependency of the workbench).  What is recorded, by
the module's own path (``model.layers.3.self_attn.q_proj``):

* every module's output (a tuple's tensors as ``NAME.0``, ``NAME.1``; a ModelOutput's as
  ``NAME.logits`` ...; the root model's outputs by their key alone: ``logits``);
* the input of every module named ``o_proj`` / ``down_proj`` / ``per_layer_projection``
  (``NAME#input``: the attention context, the MLP's and Gemma 4's per-layer gated activation,
  which no module outputs);
* the queries and keys before and after RoPE, ``ATTN.rope_q_in`` / ``rope_k_in`` /
  ``rope_q`` / ``rope_k``, by wrapping the modeling module's ``apply_rotary_pos_emb`` while
  the hooks are on (RoPE is a function in transformers, not a module).

A module called twice keeps its last call; ``rec.clear()`` forgets everything (between a
prefill and the decode step you want to diff).  Values are written as float32 safetensors
(never pickle), with ``workbench.engine`` = ``transformers`` and the engine's dtype in the
metadata, so ``workbench diff PATH engine.safetensors --engine transformers`` needs no map.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

#: modules whose *input* is recorded too (``NAME#input``)
INPUT_OF = ("o_proj", "down_proj", "per_layer_projection")


class TorchRecorder:
    def __init__(self, model, inputs_of=INPUT_OF):
        self.model = model
        self.inputs_of = tuple(inputs_of)
        self.values: dict[str, np.ndarray] = {}
        self.order: list[str] = []
        self._handles: list = []
        self._patched: list = []
        self._attn: list[str] = []  # the attention module running now (for RoPE's outputs)
        self._rope_calls: dict[str, int] = {}  # one-tensor RoPE calls so far in that module (q, then k)
        self.dtype: str | None = None

    # -- recording ------------------------------------------------------------------
    def _put(self, name: str, t) -> None:
        import torch

        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return
        if self.dtype is None:
            self.dtype = str(t.dtype).replace("torch.", "")
        if name not in self.values:
            self.order.append(name)
        self.values[name] = t.detach().to(torch.float32).cpu().numpy()

    def _put_any(self, name: str, out) -> None:
        import torch

        if isinstance(out, torch.Tensor):
            self._put(name, out)
        elif isinstance(out, (tuple, list)):
            for i, x in enumerate(out):
                if isinstance(x, torch.Tensor):
                    self._put(f"{name}.{i}", x)
        elif hasattr(out, "items"):  # a transformers ModelOutput
            for k, x in out.items():
                if isinstance(x, torch.Tensor):
                    self._put(f"{name}.{k}" if name else k, x)

    def __enter__(self) -> "TorchRecorder":
        for name, mod in self.model.named_modules():
            self._handles.append(mod.register_forward_hook(self._hook(name)))
            if name.rsplit(".", 1)[-1] in self.inputs_of:
                self._handles.append(mod.register_forward_pre_hook(self._input_hook(name)))
            if name.endswith("self_attn"):
                self._handles.append(mod.register_forward_pre_hook(self._enter_attn(name)))
        self._patch_rope()
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, attr, orig in self._patched:
            setattr(mod, attr, orig)
        self._patched.clear()

    def _hook(self, name):
        def hook(module, args, out):
            self._put_any(name, out)
            if name.endswith("self_attn") and self._attn:
                self._attn.pop()
        return hook

    def _input_hook(self, name):
        def hook(module, args):
            if args:
                self._put(f"{name}#input", args[0])
        return hook

    def _enter_attn(self, name):
        def hook(module, args):
            self._attn.append(name)
            self._rope_calls.pop(name, None)
        return hook

    def _patch_rope(self) -> None:
        seen = set()
        for mod in self.model.modules():
            m = sys.modules.get(type(mod).__module__)
            if m is None or id(m) in seen or not callable(getattr(m, "apply_rotary_pos_emb", None)):
                continue
            seen.add(id(m))
            orig = m.apply_rotary_pos_emb

            def wrapped(*a, __orig=orig, **kw):
                out = __orig(*a, **kw)
                try:  # recording never breaks the engine's forward
                    self._record_rope(a, out)
                except Exception:
                    pass
                return out

            self._patched.append((m, "apply_rotary_pos_emb", orig))
            m.apply_rotary_pos_emb = wrapped

    def _record_rope(self, args, out) -> None:
        """``apply_rotary_pos_emb(q, k, cos, sin) -> (q, k)`` (most families) or ``(x, cos, sin) -> x``
        called for the queries, then the keys (Gemma 4)."""
        import torch

        if not self._attn:
            return
        at = self._attn[-1]
        if isinstance(out, (tuple, list)) and len(out) >= 2 and len(args) >= 2:
            pairs = [("q", args[0], out[0]), ("k", args[1], out[1])]
        elif isinstance(out, torch.Tensor) and args:
            n = self._rope_calls.get(at, 0)
            self._rope_calls[at] = n + 1
            if n > 1:
                return
            pairs = [("qk"[n], args[0], out)]
        else:
            return
        for which, x, y in pairs:
            self._put(f"{at}.rope_{which}_in", x)
            self._put(f"{at}.rope_{which}", y)

    # -- results --------------------------------------------------------------------
    def clear(self) -> None:
        self.values.clear()
        self.order.clear()

    def metadata(self, ids=None, decode: bool = False) -> dict[str, str]:
        cfg = getattr(self.model, "config", None)
        meta = {"workbench.engine": "transformers", "workbench.engine_dtype": self.dtype or "float32",
                "workbench.engine_order": json.dumps(self.order)}
        if cfg is not None and getattr(cfg, "model_type", None):
            meta["workbench.engine_model_type"] = str(cfg.model_type)
        if ids is not None:
            meta["workbench.ids"] = json.dumps([int(i) for i in ids])
        if decode:
            meta["workbench.decode"] = "1"
        return meta

    def save(self, path: str | os.PathLike, ids=None, decode: bool = False) -> str:
        """Write the recorded tensors (float32 safetensors).  ``ids``: every token id the engine
        has seen (for a decode step: the prompt and the token decoded); ``decode``: the dump is
        one decode step through the engine's KV cache (the last of ``ids``)."""
        from safetensors.numpy import save_file

        from workbench import fsio

        tensors = {k: np.ascontiguousarray(self.values[k]) for k in self.order}
        fsio.write_with(path, lambda tmp: save_file(tensors, tmp, metadata=self.metadata(ids, decode)))
        return str(path)


def torch_hooks(model, inputs_of=INPUT_OF) -> TorchRecorder:
    """A recorder of every module output of ``model`` (a torch ``nn.Module``), active inside
    ``with``; see the module docstring."""
    try:
        import torch  # noqa: F401  (a clear error here rather than inside the hooks)
    except ImportError:
        raise ImportError("workbench.diff.torch_hooks records a PyTorch model: install torch") from None
    return TorchRecorder(model, inputs_of)
