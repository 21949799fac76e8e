"""Writing the zoo's files: safetensors (real or sparse) and a word-level tokenizer.json,
through fsio (exclusive temporary, renamed into place)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from workbench import fsio

_ST_DTYPE = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint32): "U32",
             np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
             np.dtype(np.uint16): "BF16"}


def to_entry(arr) -> tuple:
    """mx.array / np.ndarray -> (dtype, shape, bytes). numpy uint16 is taken as BF16 bits."""
    import mlx.core as mx

    if isinstance(arr, mx.array):
        if arr.dtype == mx.bfloat16:
            a = np.array(arr.view(mx.uint16))
            return "BF16", tuple(a.shape), a.tobytes()
        arr = np.array(arr)
    arr = np.ascontiguousarray(arr)
    return _ST_DTYPE[arr.dtype], tuple(arr.shape), arr.tobytes()


def write_safetensors(path, entries: dict, metadata: dict | None = None, *, sparse_sizes: dict | None = None):
    """Write a safetensors file. ``entries``: name -> (dtype, shape, bytes). With
    ``sparse_sizes`` (name -> nbytes) the data is not written: the file gets its full
    length as a hole (a sparse file)."""
    from workbench.checkpoint.sfile import nbytes_of

    hdr = {}
    if metadata:
        hdr["__metadata__"] = metadata
    off = 0
    names = list(entries)
    for n in names:
        dt, shape, data = entries[n]
        nb = nbytes_of(dt, shape)
        hdr[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with fsio.atomic_write(path) as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        if sparse_sizes is not None:
            f.truncate(8 + len(h) + off)
            return
        for n in names:
            f.write(entries[n][2])


def write_tokenizer(dest: Path, vocab_size: int):
    """A word-level tokenizer.json of ``vocab_size`` entries (specials, common words, letters, digits)."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:  # pragma: no cover
        return
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    words = ["the", "a", "an", "is", "of", "and", "to", "in", "it", "that", "on", "for", "with", "as", "was",
             "cat", "dog", "sat", "mat", "hello", "world", "model", "layer", "weight", "token", "engine",
             ".", ",", "!", "?"]
    words += [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    vocab = {}
    for w in specials + words:
        if w not in vocab and len(vocab) < vocab_size:
            vocab[w] = len(vocab)
    i = 0
    while len(vocab) < vocab_size:
        vocab[f"w{i}"] = len(vocab)
        i += 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fsio.write_with(dest / "tokenizer.json", lambda p: tok.save(p))
