"""Gemma 3's multimodal forward on mlx-vlm's modules, with transformers' attention masks.

mlx-vlm's ``gemma3.Model.__call__`` needs a ``mask`` whenever it is given pixels, and turns
it into one 4-D mask for every layer (``mask[:, None] * mask[:, :, None]``): with the
all-ones mask of a prompt, every layer attends to every position, future tokens
included, and the sliding window is gone.  It also scales image features by mlx-vlm's
top-level ``hidden_size``, zeroes the embedding of the pad token, and rounds the
embedding scale to bfloat16 whatever the compute dtype.

transformers' ``Gemma3ForConditionalGeneration`` (the original) computes:

* embeddings ``embed_tokens(ids) * sqrt(hidden_size)`` (the scale in the weights' dtype),
  then each image's projected features in place of its image tokens;
* full-attention layers: causal, or both tokens in the same image (bidirectional within
  an image: ``token_type_ids``, a run of image tokens);
* sliding layers: that, and within the window (``k > q - sliding_window``).

:func:`forward` does the same with mlx-vlm's own modules (the vision tower, the
projector, the embedding, every decoder layer, the norm and the head): each is called as
a module, so a module-level trace records each as a step, under the same names as the
text-only forward (``language_model``, ``model``, ``layers.N``, ...).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from workbench.reference import recorder as R


def _step(module, fn, *args, **kwargs):
    """``fn(module, ...)``, recorded as a call of ``module`` when a trace is recording."""
    tape = R.active_tape()
    if tape is None:
        return fn(module, *args, **kwargs)
    return tape.call(module, fn, args, kwargs)


def _round(x: float, dtype) -> mx.array:
    return mx.array(x, dtype=mx.float32).astype(dtype).astype(mx.float32)


def image_blocks(ids: np.ndarray, image_token: int) -> np.ndarray:
    """[B, T] image index of each image token (runs of image tokens), -1 for text."""
    img = ids == image_token
    start = img & ~np.pad(img, ((0, 0), (1, 0)))[:, :-1]
    return np.where(img, np.cumsum(start, axis=1) - 1, -1)


def masks(ids: np.ndarray, image_token: int, window: int) -> tuple[mx.array, mx.array]:
    """(full, sliding) boolean masks [B, 1, T, T] (True: attends), transformers' rules."""
    T = ids.shape[1]
    q = np.arange(T)[:, None]
    k = np.arange(T)[None, :]
    b = image_blocks(ids, image_token)
    same = (b[:, :, None] == b[:, None, :]) & (b[:, :, None] >= 0)
    full = (k <= q)[None] | same
    sliding = full & (k > q - window)[None]
    return mx.array(full[:, None]), mx.array(sliding[:, None])


def forward(model, input_ids: mx.array, pixel_values=None, cache=None, mask=None, **_ignored):
    """Logits of ``model`` (mlx-vlm's gemma3 ``Model``) as transformers computes them
    (``mask``: ignored, a prompt is never padded here)."""
    return _step(model, _root, input_ids, pixel_values=pixel_values, cache=cache)


def _root(model, input_ids, pixel_values=None, cache=None):
    from mlx_vlm.models.base import LanguageModelOutput

    cfg = model.config
    lm = model.language_model
    inner = lm.model
    tc = inner.config
    offset = 0 if cache is None else getattr(cache[0], "offset", 0)
    if offset and pixel_values is not None:
        raise ValueError("images go in a prompt's first forward (this KV cache already holds tokens)")
    ids_np = np.array(input_ids)
    image_token = cfg.image_token_index
    emb_ids = mx.where(input_ids == image_token, 0, input_ids) if image_token >= tc.vocab_size else input_ids
    h = inner.embed_tokens(emb_ids)
    dt = h.dtype
    s = float(tc.hidden_size) ** 0.5
    b = _round(s, mx.bfloat16)  # (what mlx-vlm's decoder multiplies its input by)
    h = h * (_round(s, dt) / b).astype(dt)  # (so that the decoder's input is embed * sqrt(hidden) in dt)
    where = ids_np == image_token
    if pixel_values is not None:
        hs, _, _ = model.vision_tower(pixel_values.transpose(0, 2, 3, 1).astype(dt), output_hidden_states=True)
        feats = model.multi_modal_projector(hs)
        n = int(where.sum())
        if n != feats.shape[0] * feats.shape[1]:
            raise ValueError(f"{n} image tokens for {feats.shape[0]} image(s) of {feats.shape[1]} tokens each")
        flat = feats.reshape(-1, feats.shape[-1]).astype(mx.float32) / b
        idx = np.where(where.reshape(-1), np.cumsum(where.reshape(-1)) - 1, 0).astype(np.int32)
        h = mx.where(mx.array(where)[..., None], flat[mx.array(idx)].reshape(h.shape).astype(dt), h)
    if not where.any() or input_ids.shape[1] == 1:
        return lm(input_ids, inputs_embeds=h, cache=cache)  # (no image: mlx-vlm's causal and sliding masks)
    full, sliding = masks(ids_np, image_token, tc.sliding_window)

    def run_model(m, inputs, inputs_embeds=None, cache=None):
        x = inputs_embeds * b.astype(inputs_embeds.dtype)
        p = m.sliding_window_pattern
        for i, (layer, c) in enumerate(zip(m.layers, cache if cache is not None else [None] * len(m.layers))):
            x = layer(x, full if i % p == p - 1 else sliding, c)
        return m.norm(x)

    def run_lm(m, inputs, inputs_embeds=None, cache=None):
        out = _step(inner, run_model, inputs, inputs_embeds=inputs_embeds, cache=cache)
        return LanguageModelOutput(logits=m.lm_head(out))

    return _step(lm, run_lm, input_ids, inputs_embeds=h, cache=cache)
