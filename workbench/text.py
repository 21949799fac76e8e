"""Text to token ids and back, for any model that holds a ``tokenizer`` (a ``tokenizers``
Tokenizer read from the checkpoint's tokenizer.json, or None).

    model.encode("the cat")            # token ids, <bos> first when the tokenizer adds it
    model.decode(ids)                  # the text again
    model.to_str_tokens("the cat")     # one string per token, e.g. ['<bos>', 'the', ' cat']
    model.to_single_token(" cat")      # the id of ' cat'; a text of two tokens is one error naming its pieces

A token a person types is the text of one token (``" blue"``, with its leading space):
:func:`single_token` is how every tool (the causal metrics, the lens) turns it into an id.
"""
from __future__ import annotations

import mlx.core as mx


def single_token(tokenizer, text: str, what: str = "token", first: bool = False) -> int:
    """The id of the one token ``text`` encodes to (no special tokens added).  A text of
    several tokens is one ValueError naming the text and its pieces, unless ``first=True``
    (then its first token); an empty one a ValueError too."""
    ids = list(tokenizer.encode(text, add_special_tokens=False).ids)
    if len(ids) == 1 or (first and ids):
        return ids[0]
    if not ids:
        raise ValueError(f"{what} {text!r} encodes to no token")
    pieces = ", ".join(f"{tokenizer.decode([i], skip_special_tokens=False)!r} ({i})" for i in ids[:8])
    raise ValueError(f"{what} {text!r} is {len(ids)} tokens, not one: {pieces}"
                     f"{', ...' if len(ids) > 8 else ''}; pass the text of one token or its id "
                     f"(first_token=True takes the first piece)")


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

    def to_str_tokens(self, text_or_ids) -> list[str]:
        """One string per token: of ``text`` as :meth:`encode` makes its ids (``<bos>`` first when
        the tokenizer adds it), or of token ids ([T], or [1, T] as a trace's ``ids``)."""
        if isinstance(text_or_ids, str):
            ids = self.encode(text_or_ids)
        else:
            ids = text_or_ids.tolist() if hasattr(text_or_ids, "tolist") else list(text_or_ids)
            if len(ids) == 1 and isinstance(ids[0], list):
                ids = ids[0]
        return [self.decode([int(i)]) for i in ids]

    def to_single_token(self, text: str, first_token: bool = False) -> int:
        """The id of the one token ``text`` is (``" blue"`` -> its id); several tokens are one
        error naming the pieces unless ``first_token=True`` (:func:`single_token`)."""
        if self.tokenizer is None:
            raise ValueError(f"{self._no_tokenizer()}: pass a token id instead of {text!r}")
        return single_token(self.tokenizer, text, "text", first_token)
