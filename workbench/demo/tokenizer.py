"""The demo model's tokenizer: a small byte-level BPE trained with `tokenizers`.

Special tokens follow Gemma's numbering: ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3.
Encoding adds ``<bos>`` in front (a post-processor, as Gemma's tokenizer does); digits
are split one per token.  Every word of the corpus pools ends up a single token (with
its leading space), which the training script checks.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


def train_tokenizer(lines: list[str], vocab_size: int = 512) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)])
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok
