"""Train the demo model: ``python -m workbench.demo.train --out assets/demo``.

A small gemma4_text model (sliding + full attention layers, grouped-query attention,
per-layer embeddings, logit soft-capping, tied embeddings) trained from scratch with MLX
on the generated corpus of :mod:`workbench.demo.corpus`, using mlx-lm's own gemma4_text
``Model`` class -- so the checkpoint is, by construction, in the standard MLX layout
(``config.json`` with ``model_type: gemma4_text``, ``model.safetensors``,
``tokenizer.json``) and loads with ``mlx_lm.load`` as well as ``workbench.load``.

Everything is seeded: the corpus, the tokenizer, the initial weights, the batches.
The defaults train in roughly 10 minutes on 2 CPU cores (with the fast BLAS).

``--variant 4bit`` writes an affine 4-bit quantized copy of a trained model;
``--variant moe`` trains the small mixture-of-experts variant.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from workbench import fsio
from workbench.demo import corpus
from workbench.demo.loading import build_model
from workbench.demo.tokenizer import BOS_ID, EOS_ID, PAD_ID, train_tokenizer

SEQ_LEN = 28  # longest example: <bos> + 10 words + | + 10 words + . + <eos> = 24 tokens


def demo_config(vocab_size: int) -> dict:
    """config.json of the demo model (Hugging Face field names, as a real Gemma 4)."""
    cfg = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": vocab_size,
        "vocab_size_per_layer_input": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "sliding_window": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "global_head_dim": 64,
        "hidden_size_per_layer_input": 32,
        "num_kv_shared_layers": 0,
        "attention_k_eq_v": False,
        "use_double_wide_mlp": False,
        "final_logit_softcapping": 30.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 512,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
        },
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "bos_token_id": BOS_ID,
        "enable_moe_block": False,
        "torch_dtype": "bfloat16",
    }
    return cfg


def encode_examples(tok, exs: list[corpus.Example], seq_len: int = SEQ_LEN, answer_weight: float = 1.0):
    """Token ids [N, seq_len] (<bos> text <eos> <pad>...) and per-target loss weights
    [N, seq_len - 1]: 0 on padding, ``answer_weight`` on the answer (and <eos>), 1 elsewhere."""
    ids = np.full((len(exs), seq_len), PAD_ID, dtype=np.int32)
    w = np.zeros((len(exs), seq_len - 1), dtype=np.float32)
    prompts = tok.encode_batch([e.prompt for e in exs])
    for i, e in enumerate(tok.encode_batch([e.text for e in exs])):
        t = e.ids + [EOS_ID]
        if len(t) > seq_len:
            raise ValueError(f"example {i} is {len(t)} tokens, longer than {seq_len}")
        ids[i, :len(t)] = t
        p = len(prompts[i].ids)
        w[i, :len(t) - 1] = 1.0
        w[i, p - 1:len(t) - 1] = answer_weight  # targets t[p:] are the answer tokens
    return ids, w


def loss_fn(model, ids, w):
    inputs, targets = ids[:, :-1], ids[:, 1:]
    logits = model(inputs).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, targets, reduction="none")
    return (ce * w).sum() / w.sum()


def _log(msg):
    print(msg, flush=True)


def train(model, data: tuple[np.ndarray, ...], steps: int, batch_size: int, lr: float, seed: int, log=_log,
          warmup: int = 50, weight_decay: float = 0.01, loss=loss_fn):
    """``data``: arrays with one row per example (ids, weights, ...), passed as a batch to
    ``loss(model, *batch)``."""
    rng = np.random.default_rng(seed)
    schedule = optim.join_schedules(
        [optim.linear_schedule(lr / 50, lr, warmup), optim.cosine_decay(lr, max(1, steps - warmup), lr / 20)],
        [warmup])
    opt = optim.AdamW(learning_rate=schedule, weight_decay=weight_decay, betas=[0.9, 0.98])
    vg = nn.value_and_grad(model, loss)
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(*batch):
        value, grads = vg(model, *batch)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        return value

    t0 = time.time()
    ema = None
    for it in range(steps):
        idx = rng.integers(0, len(data[0]), batch_size)
        value = step(*(mx.array(a[idx]) for a in data))
        mx.eval(value, model.parameters(), opt.state)
        lv = value.item()
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if it % 50 == 0 or it == steps - 1:
            log(f"step {it:5d}  loss {lv:.4f}  (ema {ema:.4f})  {time.time() - t0:6.1f}s")
    return ema


def save_checkpoint(out: Path, model, cfg: dict, tok, dtype=mx.bfloat16):
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    weights = {k: (v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v) for k, v in sorted(weights.items())}
    # every file through an exclusive temporary renamed into place (workbench.fsio)
    fsio.write_with(out / "model.safetensors", lambda p: mx.save_safetensors(p, weights, metadata={"format": "mlx"}))
    fsio.write_text(out / "config.json", json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    fsio.write_with(out / "tokenizer.json", lambda p: tok.save(p))
    fsio.write_text(out / "tokenizer_config.json", json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True, "model_max_length": cfg["max_position_embeddings"],
    }, indent=2) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.demo.train", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="output directory (default: assets/demo, assets/demo-moe)")
    p.add_argument("--variant", choices=("full", "moe", "4bit"), default="full")
    p.add_argument("--source", type=Path, default=None, help="4bit / moe: the trained dense model (default assets/demo)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 2000; moe 200)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 3e-3; moe 1e-3)")
    p.add_argument("--examples", type=int, default=60000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from workbench.demo import paths

    if args.variant == "4bit":
        from workbench.demo.quantize import write_4bit
        src = args.source or paths.DEMO
        out = args.out or paths.DEMO_4BIT
        write_4bit(src, out)
        print(f"wrote {out}")
        return 0

    if args.variant == "moe":
        return _train_moe(args, args.out or paths.DEMO_MOE, args.source or paths.DEMO)
    out = args.out or paths.DEMO
    t0 = time.time()
    mx.random.seed(args.seed)
    tok = train_tokenizer(corpus.tokenizer_text(), vocab_size=640)
    for w in corpus.COLORS + corpus.OBJECTS + corpus.NAMES + corpus.WORDS + ("|", "."):
        if len(tok.encode(w, add_special_tokens=False).ids) != 1:
            raise SystemExit(f"tokenizer: {w!r} is not a single token")
    cfg = demo_config(tok.get_vocab_size())
    model = build_model(cfg)
    data = encode_examples(tok, corpus.examples(args.examples, seed=corpus.TRAIN_SEED + args.seed),
                           answer_weight=ANSWER_WEIGHT)
    _describe(model, cfg, data, "demo")
    train(model, data, args.steps or STEPS, args.batch_size, args.lr or LR, seed=args.seed, warmup=50)
    save_checkpoint(out, model, cfg, tok)
    print(f"wrote {out} in {time.time() - t0:.0f}s", flush=True)
    return 0


#: training steps, peak learning rate, and the loss weight of answer tokens (the tokens
#: a task determines; weighting them up teaches the induction circuit sooner)
STEPS, LR, ANSWER_WEIGHT = 2000, 3e-3, 3.0


def _describe(model, cfg, data, what):
    n = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"{what}: {cfg['model_type']} {n / 1e6:.2f}M parameters, vocab {cfg['vocab_size']}, "
          f"{len(data[0])} training examples", flush=True)


def _train_moe(args, out: Path, src: Path) -> int:
    """Upcycle the dense model into the MoE variant and train it briefly."""
    from workbench.demo.moe import upcycle

    t0 = time.time()
    mx.random.seed(args.seed + 2)
    model, cfg = upcycle(src)
    model.train()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    data = encode_examples(tok, corpus.examples(args.examples, seed=corpus.TRAIN_SEED + 2 + args.seed),
                           answer_weight=ANSWER_WEIGHT)
    _describe(model, cfg, data, "moe")
    train(model, data, args.steps or 200, args.batch_size, args.lr or 1e-3, seed=args.seed + 2, warmup=20)
    save_checkpoint(out, model, cfg, tok)
    print(f"wrote {out} in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
