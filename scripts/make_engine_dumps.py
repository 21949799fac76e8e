"""Engine dumps with planted bugs, from transformers (torch) as the engine: tests/data/engines/.

The checkpoints are the committed tiny ones of tests/data/archs (rebuilt bit for bit from
tensors.json); the engine is transformers' own model of each, float32, eager attention,
recorded with ``workbench.diff.torch_hooks``; one bug is planted at a time:

* ``llama_clean``, ``qwen3_clean``, ``gemma3_clean``, ``gemma4_clean``: no bug (the diff must be clean);
* ``gemma4_softcap``: Gemma 4's final-logit softcap 10 where the checkpoint says 30;
* ``llama_rope_theta``: rope theta 10000 where the checkpoint says 5000;
* ``gemma3_norm_w``: Gemma's RMSNorm scale (1 + w) applied as w (every norm);
* ``qwen3_attn_scale``: layer 1's attention scaling 1/d instead of 1/sqrt(d);
* ``gemma3_softcap``: a final-logit softcap of 2.0 where the checkpoint has none (transformers'
  Gemma 3 reads attn_logit_softcapping but never applies it, so the attention softcap cannot be
  planted through its config);
* ``llama_bf16_down``: layer 1's down_proj accumulated in bfloat16 (inputs and weights rounded,
  products summed in bfloat16, one element at a time);
* ``llama_decode_clean`` / ``llama_decode_kv_off``: prefill of IDS[:-1] into the KV cache, then
  the last token decoded, recorded alone; the second with its position one too far (T, not T-1).

Also the llama.cpp eval-callback text of ``llama_clean``, ``llama_rope_theta``, ``llama_decode_kv_off``,
``gemma3_clean`` and ``gemma3_norm_w``
(``*.ggml.txt``): the same tensors under GGML's names and layouts (ne order, Q/K rows
permuted as convert_hf_to_gguf permutes them for llama), printed exactly as
llama.cpp's examples/eval-callback prints them (header line, ``%12.4f`` values, 3 first and 3
last along each of ne0..ne2, the sum): its printing code's format, not its arithmetic.  Real
llama.cpp output (``*.real.ggml.txt``) is written by scripts/make_llama_cpp_dumps.py.

    PYTHONPATH=/tmp/torchlib .venv/bin/python scripts/make_engine_dumps.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "data"))
OUT = ROOT / "tests" / "data" / "engines"
IDS = [3, 17, 42, 7, 99, 250, 1]  # 7 tokens: distinct from the head counts


def checkpoint(case: str, tmp: Path) -> Path:
    from make_arch_refs import HERE, write_checkpoint

    return write_checkpoint(tmp / case, HERE / case)


def engine(path: Path, **config):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(path)
    for k, v in config.items():
        if k == "rope_theta":
            cfg.rope_parameters["rope_theta"] = v
        else:
            setattr(cfg, k, v)
    m = AutoModelForCausalLM.from_pretrained(path, config=cfg, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def record(model, name: str, ids=IDS) -> dict:
    import torch

    from workbench.diff.torch_hooks import torch_hooks

    with torch.no_grad(), torch_hooks(model) as rec:
        model(torch.tensor([ids]))
    rec.save(OUT / f"{name}.safetensors", ids=ids)
    return rec.values


def record_decode(model, name: str, off: int = 0) -> None:
    import torch
    from transformers import DynamicCache

    from workbench.diff.torch_hooks import torch_hooks

    T = len(IDS)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.tensor([IDS[:-1]]), past_key_values=cache, use_cache=True)
        with torch_hooks(model) as rec:
            model(torch.tensor([IDS[-1:]]), past_key_values=cache, use_cache=True,
                  position_ids=torch.tensor([[T - 1 + off]]), cache_position=torch.tensor([T - 1]))
    rec.save(OUT / f"{name}.safetensors", ids=IDS, decode=True)
    return rec.values


def gemma_norm_as_w():
    import torch
    from transformers.models.gemma3 import modeling_gemma3 as g

    def forward(self, x):  # the bug: w, not (1 + w)
        out = self._norm(x.float())
        return (out * self.weight.float()).type_as(x)

    g.Gemma3RMSNorm.forward = forward


def bf16_accumulate(linear):
    import torch

    def forward(x):
        xb = x.to(torch.bfloat16)
        wb = linear.weight.to(torch.bfloat16)
        acc = torch.zeros(x.shape[:-1] + (wb.shape[0],), dtype=torch.bfloat16)
        for k in range(x.shape[-1]):  # sum the products in bfloat16, one term at a time
            acc = acc + xb[..., k:k + 1] * wb[:, k]
        return acc.to(torch.float32)

    linear.forward = forward


# ---------------------------------------------------------------- llama.cpp's eval-callback text
def _ggml_name(hf: str, v: np.ndarray):
    """(GGML name, GGML op, value in HF order) for a recorded llama tensor, or None."""
    import re

    m = re.fullmatch(r"model\.layers\.(\d+)(?:\.(.+))?", hf)
    if hf == "model.embed_tokens":
        return "inp_embd", "GET_ROWS", v
    if hf == "model.norm":
        return "result_norm", "MUL", v
    if hf == "logits":
        return "result_output", "MUL_MAT", v
    if not m:
        return None
    i, rest = m.group(1), m.group(2) or ""
    table = {"input_layernorm": ("attn_norm", "MUL"), "self_attn.q_proj": ("Qcur", "MUL_MAT"),
             "self_attn.k_proj": ("Kcur", "MUL_MAT"), "self_attn.v_proj": ("Vcur", "MUL_MAT"),
             "self_attn.rope_q": ("Qcur", "ROPE"), "self_attn.rope_k": ("Kcur", "ROPE"),
             "self_attn.1": ("kq_soft_max", "SOFT_MAX"), "self_attn.o_proj#input": ("kqv_out", "CONT"),
             "self_attn.o_proj": ("attn_out", "MUL_MAT"), "post_attention_layernorm": ("ffn_norm", "MUL"),
             "mlp.gate_proj": ("ffn_gate", "MUL_MAT"), "mlp.up_proj": ("ffn_up", "MUL_MAT"),
             "mlp.down_proj#input": ("ffn_swiglu", "GLU"), "mlp.down_proj": ("ffn_out", "MUL_MAT"),
             "": ("l_out", "ADD")}
    if rest not in table:
        return None
    name, op = table[rest]
    return f"{name}-{i}", op, v


def _to_ggml(name: str, op: str, v: np.ndarray, head_dim: int, n_kv: int) -> np.ndarray:
    """HF value -> the array llama.cpp holds (numpy order = reversed ne)."""
    v = v[0]  # no batch
    if name.startswith(("Qcur", "Kcur")):  # convert_hf_to_gguf permutes Q/K rows for llama's rope
        if op == "ROPE":
            v = np.transpose(v, (1, 0, 2))  # [H, T, d] -> [T, H, d] (ne {d, H, T})
        sh = v.shape
        v = v.reshape(sh[:-1] + (-1, 2, head_dim // 2)).swapaxes(-1, -2).reshape(sh)
    if name.startswith("attn_out") or name.startswith("ffn_out") or op in ("MUL", "ADD", "GET_ROWS", "GLU", "CONT"):
        pass
    if name.startswith("kq_soft_max"):  # [H, T, S] -> keys padded to the cache's n_kv cells
        pad = np.zeros(v.shape[:-1] + (n_kv - v.shape[-1],), np.float32)
        v = np.concatenate([v, pad], axis=-1)
    return v


def _print_tensor(name: str, op: str, src0: str, v: np.ndarray, out: list) -> None:
    ne = list(reversed(v.shape)) + [1] * (4 - v.ndim)
    nes = ", ".join(str(x) for x in ne)
    out.append(f"ggml_debug: {name:>24} = (f32) {op:>10}({src0}{{{nes}}}, }}) = {{{nes}}}")
    a = v.reshape(ne[3], ne[2], ne[1], ne[0])
    n = 3
    for i3 in range(ne[3]):
        s = np.float32(0)
        out.append(" " * 37 + "[")
        i2 = 0
        while i2 < ne[2]:
            if i2 == n and ne[2] > 2 * n:
                out.append(" " * 38 + "..., ")
                i2 = ne[2] - n
            out.append(" " * 38 + "[")
            i1 = 0
            while i1 < ne[1]:
                if i1 == n and ne[1] > 2 * n:
                    out.append(" " * 39 + "..., ")
                    i1 = ne[1] - n
                row = " " * 39 + "["
                i0 = 0
                while i0 < ne[0]:
                    if i0 == n and ne[0] > 2 * n:
                        row += "..., "
                        i0 = ne[0] - n
                    x = a[i3, i2, i1, i0]
                    row += "%12.4f" % x
                    s = np.float32(s + x)
                    if i0 < ne[0] - 1:
                        row += ", "
                    i0 += 1
                out.append(row + "],")
                i1 += 1
            out.append(" " * 38 + "],")
            i2 += 1
        out.append(" " * 37 + "]")
        out.append(" " * 37 + "sum = %f" % s)


def write_eval_callback(values: dict, name: str, head_dim: int = 16, n_kv: int = 32) -> None:
    lines = ["llama_context: n_ctx = 32", "llama_context: graph nodes = 000"]
    for hf, v in values.items():
        g = _ggml_name(hf, v)
        if g is None:
            continue
        gname, op, v = g
        _print_tensor(gname, op, "src", _to_ggml(gname, op, v, head_dim, n_kv), lines)
    (OUT / f"{name}.ggml.txt").write_text("\n".join(lines) + "\n")


def gemma_ggml(values: dict, n_layers: int = 2) -> dict:
    """A Gemma 3 transformers dump under llama.cpp's Gemma 3 graph names (src/models/gemma3):
    no Q/K permutation (NEOX rope), ``inp_scaled``, views named ``Qcur-0 (reshaped)``,
    ``ffn_post_norm`` named without its layer, and the last layer holding only the output row
    (the last token) from the attention output on, as ``inp_out_ids`` leaves it."""
    out = {}
    last = n_layers - 1
    out[("inp_scaled", "SCALE")] = values["model.embed_tokens"][0]
    for i in range(n_layers):
        L = f"model.layers.{i}"
        prev = values["model.embed_tokens"] if i == 0 else values[f"model.layers.{i - 1}"]
        q, k = values[f"{L}.self_attn.q_proj"][0], values[f"{L}.self_attn.k_proj"][0]
        d = values[f"{L}.self_attn.q_norm"].shape[-1]
        rows = (lambda a: a[-1:]) if i == last else (lambda a: a)
        seq = [(f"attn_norm-{i}", "MUL", values[f"{L}.input_layernorm"][0]),
               (f"Qcur-{i}", "MUL_MAT", q), (f"Kcur-{i}", "MUL_MAT", k),
               (f"Vcur-{i}", "MUL_MAT", values[f"{L}.self_attn.v_proj"][0]),
               (f"Qcur-{i} (reshaped)", "RESHAPE", q.reshape(q.shape[0], -1, d)),
               (f"Kcur-{i} (reshaped)", "RESHAPE", k.reshape(k.shape[0], -1, d)),
               (f"Qcur_normed-{i}", "MUL", np.transpose(values[f"{L}.self_attn.q_norm"][0], (1, 0, 2))),
               (f"Kcur_normed-{i}", "MUL", np.transpose(values[f"{L}.self_attn.k_norm"][0], (1, 0, 2))),
               (f"Qcur-{i}", "ROPE", np.transpose(values[f"{L}.self_attn.rope_q"][0], (1, 0, 2))),
               (f"Kcur-{i}", "ROPE", np.transpose(values[f"{L}.self_attn.rope_k"][0], (1, 0, 2))),
               (f"kq_soft_max-{i}", "SOFT_MAX", values[f"{L}.self_attn.1"][0]),
               (f"kqv_out-{i}", "CONT", values[f"{L}.self_attn.o_proj#input"][0]),
               (f"attn_out-{i}", "MUL_MAT", rows(values[f"{L}.self_attn.o_proj"][0])),
               (f"attn_post_norm-{i}", "MUL", rows(values[f"{L}.post_attention_layernorm"][0])),
               (f"sa_out-{i}", "ADD", rows(prev[0] + values[f"{L}.post_attention_layernorm"][0])),
               (f"ffn_norm-{i}", "MUL", rows(values[f"{L}.pre_feedforward_layernorm"][0])),
               (f"ffn_gate-{i}", "MUL_MAT", rows(values[f"{L}.mlp.gate_proj"][0])),
               (f"ffn_up-{i}", "MUL_MAT", rows(values[f"{L}.mlp.up_proj"][0])),
               (f"ffn_geglu-{i}", "GLU", rows(values[f"{L}.mlp.down_proj#input"][0])),
               (f"ffn_out-{i}", "MUL_MAT", rows(values[f"{L}.mlp.down_proj"][0])),
               ("ffn_post_norm", "MUL", rows(values[f"{L}.post_feedforward_layernorm"][0])),
               (f"l_out-{i}", "ADD", rows(values[L][0]))]
        for j, (name, op, v) in enumerate(seq):
            out[(name, op, i, j)] = v
    out[("result_norm", "MUL")] = values["model.norm"][0][-1:]
    out[("result_output", "MUL_MAT")] = values["logits"][0][-1:]
    return out


def write_gemma_eval_callback(values: dict, name: str, n_kv: int = 32) -> None:
    lines = ["llama_context: n_ctx = 32"]
    for key, v in gemma_ggml(values).items():
        gname, op = key[0], key[1]
        if gname.startswith("kq_soft_max"):
            v = np.concatenate([v, np.zeros(v.shape[:-1] + (n_kv - v.shape[-1],), np.float32)], axis=-1)
        _print_tensor(gname, op, "src", np.ascontiguousarray(v, np.float32), lines)
    (OUT / f"{name}.ggml.txt").write_text("\n".join(lines) + "\n")


def main() -> None:
    import torch

    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        llama, qwen3, gemma3 = (checkpoint(c, tmp) for c in ("llama", "qwen3", "gemma3_text"))
        write_eval_callback(record(engine(llama), "llama_clean"), "llama_clean")
        record(engine(qwen3), "qwen3_clean")
        write_gemma_eval_callback(record(engine(gemma3), "gemma3_clean"), "gemma3_clean")
        write_eval_callback(record(engine(llama, rope_theta=10000.0), "llama_rope_theta"), "llama_rope_theta")
        m = engine(qwen3)
        m.model.layers[1].self_attn.scaling = 1.0 / m.config.head_dim
        record(m, "qwen3_attn_scale")
        record(engine(gemma3, final_logit_softcapping=2.0), "gemma3_softcap")
        m = engine(llama)
        bf16_accumulate(m.model.layers[1].mlp.down_proj)
        record(m, "llama_bf16_down")
        record_decode(engine(llama), "llama_decode_clean")
        gemma4 = checkpoint("gemma4_text", tmp)
        record(engine(gemma4), "gemma4_clean")
        record(engine(gemma4, final_logit_softcapping=10.0), "gemma4_softcap")
        write_eval_callback(record_decode(engine(llama), "llama_decode_kv_off", off=1), "llama_decode_kv_off")
        gemma_norm_as_w()
        write_gemma_eval_callback(record(engine(gemma3), "gemma3_norm_w"), "gemma3_norm_w")


if __name__ == "__main__":
    main()
