"""Text to token ids and back, for any model that holds a ``tokenizer`` (a ``tokenizers``
Tokenizer read from the checkpoint's tokenizer.json, or None)."""
from __future__ import annotations

import mlx.core as mx


class TextCodec:
    """``encode(text) -> ids`` and ``decode(ids) -> text`` through ``self.tokenizer``."""

    tokenizer = None

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer.json: pass token ids instead of text")
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids) -> str:
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer.json")
        if isinstance(ids, mx.array):
            ids = ids.tolist()
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)
