"""Text to token ids and back, for any model that holds a ``tokenizer`` (a ``tokenizers``
Tokenizer read from the checkpoint's tokenizer.json, or None)."""
from __future__ import annotations

import mlx.core as mx


class TextCodec:
    """``encode(text) -> ids`` and ``decode(ids) -> text`` through ``self.tokenizer``."""

    tokenizer = None

    def _no_tokenizer(self) -> str:
        """Why there is no tokenizer: the reader's reason for refusing tokenizer.json (a FIFO,
        a device, too big) when it was there, else that it is missing."""
        why = getattr(getattr(self, "checkpoint", None), "tokenizer_error", None)
        return f"this checkpoint's {why}" if why else "this checkpoint has no tokenizer.json"

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"{self._no_tokenizer()}: pass token ids instead of text")
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids) -> str:
        if self.tokenizer is None:
            raise ValueError(self._no_tokenizer())
        if isinstance(ids, mx.array):
            ids = ids.tolist()
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)
