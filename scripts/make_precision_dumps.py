"""Engine dumps in float32, bfloat16 and float16, clean and with small planted bugs: tests/data/engines/precision/.

The test data of issue 39 item 7 (a diff that knows each op's rounding).  The checkpoints are
the committed tiny ones of tests/data/archs (llama, qwen3, gemma3_text, gemma4_text, rebuilt bit
for bit); the engine is transformers' own model of each, eager attention, ``model.to(dtype)``
for float32 / bfloat16 / float16, run on scripts/make_engine_dumps.py's ids and recorded with
``workbench.diff.torch_hooks`` as that script records (its functions are imported, not copied).

Every dump is then written **as plain forward hooks would write it**: every tensor float32,
and no metadata about the engine's precision.  Of what torch_hooks writes, only
``workbench.engine`` (names the adapter: no --engine needed) and ``workbench.ids`` (the token
ids: no --ids needed) are kept; ``workbench.engine_dtype``, ``workbench.engine_order``,
``workbench.engine_model_type`` and ``workbench.decode`` are dropped (the manifest says which
dumps are decode steps).

Per dtype and architecture, a clean run and one planted bug at a time (all in layer 1):

* ``rms_eps``: RMSNorm eps 0.1 in ``layers.1.input_layernorm`` only;
* ``bf16_down``: ``layers.1.mlp.down_proj`` with bfloat16 operands and a bfloat16 accumulator
  (make_engine_dumps.bf16_accumulate; float32 and float16 engines only);
* ``fp8_weight``: ``layers.1.self_attn.q_proj``'s weight rounded to float8 e4m3 (per-tensor
  scale amax / 448, as an fp8 checkpoint stores it, then dequantised; torch.float8_e4m3fn), every
  other weight exact;
* ``rope_freq``: RoPE inverse frequencies x 1.02 in layer 1 only (layer 1's
  ``position_embeddings`` recomputed by a copy of the model's rotary module with its inv_freq
  buffers scaled);
* ``norm_scale`` (Gemma only): ``layers.1.pre_feedforward_layernorm`` with the wrong scale
  convention: Gemma 3 stores w for a (1 + w) scale and the bug applies w
  (make_engine_dumps.gemma_norm_as_w, on that one norm); Gemma 4's norms scale by w itself, so
  there the bug is the other way round: (1 + w);
* llama only, ``decode_clean`` / ``decode_pos_off``: prefill of ids[:-1], the last id decoded
  and recorded alone (make_engine_dumps.record_decode), the second with its position one too far.

Each bug case's effect ratio is written to manifest.json: at the op where the bug enters, the
bug's effect (nmse of the buggy engine's tensor against the clean engine of the same dtype)
over that dtype's rounding there (nmse of the clean engine of that dtype against the clean
float32 engine; for float32, of the clean float32 engine against the same model run in
float64).  nmse = mean((x - ref)^2) / var(ref), as workbench.diff.metrics, in float64.  A
case is committed only if its ratio is >= MIN_RATIO; the others are listed under "dropped".

llama.cpp (llama, float32, clean and rope_freq): the eval-callback text
(make_engine_dumps.write_eval_callback) and one tensor per GGML name as a ``cb_eval`` hook
keeping a dict would write it (``*.ggml.safetensors``: each name once, the last value printed
under it kept, so ``Qcur-N`` holds Q after RoPE; numpy shape = GGML's ne reversed, 4 dims).

    pip install --target /tmp/torchlib torch==2.13.0
    PYTHONPATH=/tmp/torchlib .venv/bin/python scripts/make_precision_dumps.py
    .venv/bin/python scripts/make_precision_dumps.py --baseline   # today's diff on every case (no torch)
"""
from __future__ import annotations

import copy
import importlib
import inspect
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "data"))
import make_engine_dumps as med  # noqa: E402

OUT = ROOT / "tests" / "data" / "engines" / "precision"
IDS = med.IDS
MIN_RATIO = 10.0
#: short name -> the checkpoint case of tests/data/archs
ARCHS = {"llama": "llama", "qwen3": "qwen3", "gemma3": "gemma3_text", "gemma4": "gemma4_text"}
#: short tag -> torch dtype name
DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
#: the metadata kept of what torch_hooks writes
KEEP_META = ("workbench.engine", "workbench.ids")
#: bug -> (the engine tensor where it enters, the dtypes it is planted in, the archs)
BUGS = {
    "rms_eps": ("model.layers.1.input_layernorm", tuple(DTYPES), tuple(ARCHS)),
    "bf16_down": ("model.layers.1.mlp.down_proj", ("f32", "f16"), tuple(ARCHS)),
    "fp8_weight": ("model.layers.1.self_attn.q_proj", tuple(DTYPES), tuple(ARCHS)),
    "rope_freq": ("model.layers.1.self_attn.rope_q", tuple(DTYPES), tuple(ARCHS)),
    "norm_scale": ("model.layers.1.pre_feedforward_layernorm", tuple(DTYPES), ("gemma3", "gemma4")),
}
DECODE_ENTRY = "model.layers.0.self_attn.rope_q"
#: (arch, dtype) pairs not made, to keep the folder near 6 MB (Gemma's dumps are the largest:
#: Gemma 4's 300 kB, Gemma 3's 127 kB each): float16 for Gemma 3 and Gemma 4
SKIP = {("gemma3", "f16"), ("gemma4", "f16")}


# ---------------------------------------------------------------- engines and bugs
def make_engine(path: Path, dtype: str):
    import torch

    return med.engine(path).to(getattr(torch, dtype))


def plant_rms_eps(model, arch: str, dtype: str) -> None:
    norm = model.model.layers[1].input_layernorm
    attr = "variance_epsilon" if hasattr(norm, "variance_epsilon") else "eps"
    assert hasattr(norm, attr), type(norm)
    setattr(norm, attr, 0.1)


def plant_bf16_down(model, arch: str, dtype: str) -> None:
    lin = model.model.layers[1].mlp.down_proj
    med.bf16_accumulate(lin)  # returns float32: cast back to the engine's dtype
    f = lin.forward
    lin.forward = lambda x: f(x).to(x.dtype)


def plant_fp8_weight(model, arch: str, dtype: str) -> None:
    import torch

    lin = model.model.layers[1].self_attn.q_proj
    w = lin.weight.data.float()
    scale = w.abs().max() / 448.0  # e4m3's largest finite value
    q = (w / scale).to(torch.float8_e4m3fn).float() * scale
    lin.weight.data = q.to(lin.weight.dtype)


def plant_rope_freq(model, arch: str, dtype: str, factor: float = 1.02) -> None:
    import torch

    rot = copy.deepcopy(model.model.rotary_emb)
    with torch.no_grad():
        for name, buf in rot.named_buffers():
            if "inv_freq" in name:
                buf.copy_((buf.float() * factor).to(buf.dtype))
    layer_type = model.config.layer_types[1] if "layer_type" in inspect.signature(rot.forward).parameters else None

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        pos = kwargs["position_ids"]
        kwargs["position_embeddings"] = rot(x, pos, layer_type) if layer_type else rot(x, pos)
        return args, kwargs

    model.model.layers[1].register_forward_pre_hook(hook, with_kwargs=True)


def plant_norm_scale(model, arch: str, dtype: str) -> None:
    norm = model.model.layers[1].pre_feedforward_layernorm
    if arch == "gemma3":  # (1 + w) applied as w: make_engine_dumps' class patch, taken for this norm only
        from transformers.models.gemma3 import modeling_gemma3 as g

        orig = g.Gemma3RMSNorm.forward
        med.gemma_norm_as_w()
        buggy, g.Gemma3RMSNorm.forward = g.Gemma3RMSNorm.forward, orig
        norm.forward = types.MethodType(buggy, norm)
    else:  # Gemma 4 scales by w: the bug is Gemma 3's (1 + w)

        def forward(self, x):
            return (self._norm(x.float()) * (1.0 + self.weight.float())).type_as(x)

        norm.forward = types.MethodType(forward, norm)


PLANT = {"rms_eps": plant_rms_eps, "bf16_down": plant_bf16_down, "fp8_weight": plant_fp8_weight,
         "rope_freq": plant_rope_freq, "norm_scale": plant_norm_scale}


# ---------------------------------------------------------------- recording
def save_f32(tensors: dict, path: Path, metadata: dict) -> None:
    """A float32 safetensors file, byte for byte the same on every run (safetensors' own writer
    orders the metadata as a hash map does: differently each run): header keys sorted, tensors
    in name order."""
    header, data, at = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for k in sorted(tensors):
        a = np.ascontiguousarray(tensors[k], dtype="<f4")
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        data.append(a.tobytes())
        at += a.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(data))


def strip_metadata(path: Path) -> None:
    """Rewrite a torch_hooks dump with only :data:`KEEP_META` (every tensor is float32 already)."""
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert all(v.dtype == np.float32 for v in tensors.values())
    save_f32(tensors, path, {k: meta[k] for k in KEEP_META if k in meta})


def record(model, name: str) -> dict:
    med.OUT = OUT
    values = med.record(model, name)
    strip_metadata(OUT / f"{name}.safetensors")
    return values


def record_decode(model, name: str, off: int = 0) -> dict:
    med.OUT = OUT
    values = med.record_decode(model, name, off=off)
    strip_metadata(OUT / f"{name}.safetensors")
    return values


def _float64_recorder(model, inputs_of=None):
    """torch_hooks' recorder keeping float64 values (the float32 engine's rounding is measured
    against them; a cast to float32 would add a rounding of its own)."""
    import torch

    th = importlib.import_module("workbench.diff.torch_hooks")

    class Rec64(th.TorchRecorder):
        def _put(self, name, t):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                if name not in self.values:
                    self.order.append(name)
                self.values[name] = t.detach().to(torch.float64).cpu().numpy()

    return Rec64(model, inputs_of or th.INPUT_OF)


def record_f64(model, decode: bool = False) -> dict:
    """The model's values in float64 (nothing written here: make_engine_dumps' recorders run
    into a temporary folder with torch_hooks swapped for the float64 recorder)."""
    th = importlib.import_module("workbench.diff.torch_hooks")

    saved = th.torch_hooks, med.OUT
    with tempfile.TemporaryDirectory() as tmp:
        th.torch_hooks, med.OUT = _float64_recorder, Path(tmp)
        try:
            return med.record_decode(model, "f64") if decode else med.record(model, "f64")
        finally:
            th.torch_hooks, med.OUT = saved


def nmse(x: np.ndarray, ref: np.ndarray) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    mse = float(np.mean((x - ref) ** 2))
    var = float(np.var(ref))
    return mse / var if var > 0 else (0.0 if mse == 0 else float("inf"))


# ---------------------------------------------------------------- llama.cpp
def write_ggml_dict(values: dict, name: str, head_dim: int = 16, n_kv: int = 32) -> None:
    """One tensor per GGML name, as a cb_eval hook keeping a dict writes it: every node printed
    by the eval-callback text, in its order, ``d[name] = value`` (the last one stays)."""
    d: dict = {}
    for hf, v in values.items():
        g = med._ggml_name(hf, v)
        if g is None:
            continue
        gname, op, v = g
        a = med._to_ggml(gname, op, v, head_dim, n_kv)
        ne = list(reversed(a.shape)) + [1] * (4 - a.ndim)
        d[gname] = np.ascontiguousarray(a.reshape(ne[::-1]), np.float32)
    save_f32(d, OUT / f"{name}.ggml.safetensors", {"workbench.engine": "llama.cpp", "workbench.ids": json.dumps(IDS)})


# ---------------------------------------------------------------- the cases
def our_op(adapter, hf: str, program_names) -> str:
    op, _ = adapter.op_for(hf, set(program_names))
    assert op and op in program_names, (hf, op)
    return op


def main() -> None:
    import torch

    import workbench
    from workbench.diff.engines import load as load_adapter

    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*"):
        if old.suffix in (".safetensors", ".txt") or old.name == "manifest.json":
            old.unlink()
    adapter = load_adapter("transformers")
    kept, dropped = [], []

    def entry(file, arch, tag, bug, hf_entry, names, effect=None, rounding=None, **extra):
        e = {"file": file, "arch": arch, "checkpoint": ARCHS[arch], "engine_dtype": DTYPES[tag], "bug": bug,
             "entry_op": our_op(adapter, hf_entry, names) if hf_entry else None,
             "engine_tensor": hf_entry, "effect_nmse": effect, "rounding_nmse": rounding,
             "rounding_against": None if bug in ("clean", "decode_clean") else
             ("float64 engine" if tag == "f32" else "float32 engine"),
             "ratio": None if effect is None else (effect / rounding if rounding > 0 else float("inf")),
             "engine": "transformers", "layout": "torch_hooks", "decode": False}
        e.update(extra)
        e["clean_file"] = (None if effect is None else  # the same dtype's clean run: the effect is measured against it
                           f"{arch}_{tag}_{'decode_clean' if e['decode'] else 'clean'}.safetensors")
        return e

    def judge(e):
        (kept if e["ratio"] is None or e["ratio"] >= MIN_RATIO else dropped).append(e)
        if e in dropped:
            (OUT / e["file"]).unlink()
            e["file"] = None
            e["why"] = (f"ratio {e['ratio']:.3g} < {MIN_RATIO:g}: at its entry op the bug's effect is within "
                        f"{MIN_RATIO:g}x the {e['engine_dtype']} engine's rounding there: not written")
        print(f"{e['arch']:7s} {e['engine_dtype']:9s} {e['bug']:15s} {e['entry_op'] or '':36s} "
              f"effect {e['effect_nmse'] or 0:.3g} rounding {e['rounding_nmse'] or 0:.3g} ratio "
              f"{e['ratio'] if e['ratio'] is None else round(e['ratio'], 2)}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for arch, case in ARCHS.items():
            path = med.checkpoint(case, tmp)
            names = workbench.load(str(path)).program.names
            f64 = record_f64(make_engine(path, "float64"))
            clean, llama_cpp = {}, {}
            for tag, dtype in DTYPES.items():
                if (arch, tag) in SKIP:
                    continue
                name = f"{arch}_{tag}_clean"
                clean[tag] = record(make_engine(path, dtype), name)
                judge(entry(f"{name}.safetensors", arch, tag, "clean", None, names))
            if arch == "llama":
                llama_cpp["clean"] = clean["f32"]
            for bug, (hf, tags, archs) in BUGS.items():
                if arch not in archs:
                    continue
                for tag in tags:
                    if tag not in clean:
                        continue
                    m = make_engine(path, DTYPES[tag])
                    PLANT[bug](m, arch, DTYPES[tag])
                    name = f"{arch}_{tag}_{bug}"
                    vals = record(m, name)
                    ref = f64[hf] if tag == "f32" else clean["f32"][hf]
                    e = entry(f"{name}.safetensors", arch, tag, bug, hf, names, effect=nmse(vals[hf], clean[tag][hf]),
                              rounding=nmse(clean[tag][hf], ref))
                    judge(e)
                    if arch == "llama" and tag == "f32" and bug == "rope_freq" and e["file"]:
                        llama_cpp[bug] = vals
            if arch == "llama":  # a decode step, clean and with its position one too far
                d64 = record_f64(make_engine(path, "float64"), decode=True)
                dclean = {}
                for tag, dtype in DTYPES.items():
                    name = f"llama_{tag}_decode_clean"
                    dclean[tag] = record_decode(make_engine(path, dtype), name)
                    judge(entry(f"{name}.safetensors", arch, tag, "decode_clean", None, names, decode=True))
                for tag, dtype in DTYPES.items():
                    name = f"llama_{tag}_decode_pos_off"
                    vals = record_decode(make_engine(path, dtype), name, off=1)
                    ref = d64[DECODE_ENTRY] if tag == "f32" else dclean["f32"][DECODE_ENTRY]
                    judge(entry(f"{name}.safetensors", arch, tag, "decode_pos_off", DECODE_ENTRY, names,
                                effect=nmse(vals[DECODE_ENTRY], dclean[tag][DECODE_ENTRY]),
                                rounding=nmse(dclean[tag][DECODE_ENTRY], ref), decode=True))
                med.OUT = OUT
                for bug, vals in llama_cpp.items():
                    name = f"llama_f32_{bug}"
                    med.write_eval_callback(vals, name)
                    write_ggml_dict(vals, name)
                    src = next(e for e in kept if e["file"] == f"{name}.safetensors")
                    for layout, suffix in (("eval-callback text", ".ggml.txt"), ("cb_eval dict", ".ggml.safetensors")):
                        kept.append(dict(src, file=name + suffix, engine="llama.cpp", layout=layout,
                                         clean_file=None if bug == "clean" else "llama_f32_clean" + suffix))

    manifest = {
        "about": "tests/data/engines/precision: transformers engines in float32, bfloat16 and float16 with "
                 "planted bugs, written by scripts/make_precision_dumps.py (see README.md). ratio = effect_nmse / "
                 "rounding_nmse at entry_op; a bug case is kept only if ratio >= min_ratio.",
        "ids": IDS, "min_ratio": MIN_RATIO, "kept_metadata": list(KEEP_META),
        "skipped": sorted(f"{a}_{t}" for a, t in SKIP),
        "cases": kept, "dropped": dropped,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(kept)} files, {len(dropped)} cases dropped")


# ---------------------------------------------------------------- today's diff on every case
def verdict(out: dict) -> str:
    if out.get("first_divergence"):
        op, local = out["first_divergence"]["op"], out.get("first_local_divergence")
        return f"first divergence: {op}" + (f" (local: {local})" if local and local != op else "")
    if out.get("first_local_divergence"):
        return f"local: {out['first_local_divergence']}"
    return "no divergence"


def run_diff(ckpt: str, case: dict, decode_flag: bool | None = None) -> dict:
    """``workbench diff CKPT DUMP --json`` (``--decode`` where asked) -> its JSON."""
    import contextlib
    import io

    from workbench.cli import main as cli

    argv = ["diff", ckpt, str(OUT / case["file"]), "--json"]
    if case["file"].endswith(".txt"):  # llama.cpp's text carries no token ids
        argv += ["--ids", ",".join(str(i) for i in IDS)]
    if decode_flag:
        argv.append("--decode")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli(argv)
    text = buf.getvalue()
    try:
        out = json.loads(text)
    except ValueError:
        out = {"error": text.strip()[-300:]}
    out["rc"] = rc
    return out


def baseline() -> None:
    """Print today's diff on every committed case: a markdown table and, per engine dtype, the
    bug cases named at their entry op / named elsewhere / missed and the clean runs flagged."""
    from make_arch_refs import HERE, write_checkpoint

    man = json.loads((OUT / "manifest.json").read_text())
    rows = ["| case | engine dtype | expected entry op | ratio | today's verdict |", "|---|---|---|---|---|"]
    tally: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        ck = {c: str(write_checkpoint(Path(tmp) / c, HERE / c)) for c in ARCHS.values()}
        for c in man["cases"]:
            out = run_diff(ck[c["checkpoint"]], c)
            v = verdict(out) if "error" not in out else "error: " + out["error"].splitlines()[-1][:120]
            t = tally.setdefault(c["engine_dtype"], {"at entry op": 0, "elsewhere": 0, "missed": 0,
                                                     "clean runs": 0, "false alarms": 0})
            if c["entry_op"] is None:
                t["clean runs"] += 1
                t["false alarms"] += v != "no divergence"
            else:
                found = {(out.get("first_divergence") or {}).get("op"), out.get("first_local_divergence")} - {None}
                key = "missed" if not found else "at entry op" if c["entry_op"] in found else "elsewhere"
                t[key] += 1
            if c["decode"]:
                v2 = run_diff(ck[c["checkpoint"]], c, decode_flag=True)
                v = f"{v}; with --decode: {verdict(v2)}"
            ratio = "" if c["ratio"] is None else f"{c['ratio']:.3g}"
            rows.append(f"| {c['file']} | {c['engine_dtype']} | {c['entry_op'] or '(clean)'} | {ratio} | {v} |")
    print("\n".join(rows))
    print("\n| engine dtype | bug cases named at their entry op | named elsewhere | missed | clean runs | "
          "clean runs flagged |\n|---|---|---|---|---|---|")
    for dt, t in tally.items():
        n = t["at entry op"] + t["elsewhere"] + t["missed"]
        print(f"| {dt} | {t['at entry op']} / {n} | {t['elsewhere']} | {t['missed']} | {t['clean runs']} | "
              f"{t['false alarms']} |")


if __name__ == "__main__":
    baseline() if "--baseline" in sys.argv[1:] else main()
