"""Notebook 08 (generation and the KV cache): the exercises, their answers and their hints."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from workbench.exercises import fixtures as fx
from workbench.exercises.core import Exercise, ordered, register, value

FORWARD = 30   # the forward the predictions ask about, in a long generation from the notebook's prompt


def _prompt_len() -> int:
    return len(fx.demo().encode(fx.GEN_PROMPT))


@lru_cache(maxsize=None)
def _generation():
    from workbench.trace import generate

    return generate(fx.demo(), fx.GEN_PROMPT, max_tokens=6, capture="full")


def _offsets_case():
    g = _generation()
    return (_prompt_len(), len(g.traces)), [int(np.array(t.value("rope_offset"))[0]) for t in g.traces]


def _tokens_case():
    g = _generation()
    return ([np.array(t.logits, dtype=np.float64).reshape(-1, np.array(t.logits).shape[-1]) for t in g.traces],), \
        [int(x) for x in g.tokens[:len(g.traces)]]


register(
    Exercise(
        "08.1", "predict", "a number",
        value("the prefill caches every prompt position; each later forward adds the one token it reads",
              mistakes=[(lambda e, a: e - 1, "forward k also caches the token it reads (generated token k - 1) before attending"),
                        (lambda e, a: e + 1, "the token forward k produces is its output: it is cached by the next forward"),
                        (16, "layers.3 is the full-attention layer: no sliding window drops old positions")]),
        expected=lambda: _prompt_len() + FORWARD,
        solution="""# forward k's cache: the prompt's positions, plus the k tokens read since the prefill
# (generated tokens 0 .. k-1; token k is the output, not yet cached)
len(prompt_ids) + 30
g30 = workbench.generate(model, prompt, max_tokens=31, capture=["layers.3.self_attn.k_cache"], past_eos=True)
g30.traces[30].step_info("layers.3.self_attn.k_cache").output_shape[2]"""),
    Exercise(
        "08.2", "predict", "a number",
        value("rope_offset is the position of the forward's only token: count from 0, <bos> included",
              mistakes=[(lambda e, a: e + 1, "positions count from 0: the prompt holds positions 0 .. len - 1"),
                        (FORWARD, "the prompt's positions come first: the generated tokens sit after them")]),
        expected=lambda: _prompt_len() + FORWARD - 1,
        solution="""# forward k reads generated token k - 1, which sits at position len(prompt) + k - 1
len(prompt_ids) + 30 - 1"""),
    Exercise(
        "08.3", "implement", "a function rope_offsets(prompt_len, forwards) returning a list, one offset per forward",
        ordered("offsets", "the prefill starts at 0; forward k (k >= 1) reads the token at position prompt_len + k - 1",
                "the prefill first, then the forwards in order",
                mistakes=[(lambda e, a: [0] + [a[0] + k for k in range(1, a[1])],
                           "off by one: forward 1 reads generated token 0, at position prompt_len"),
                          (lambda e, a: list(range(a[1])), "a decode forward is not at position k: the prompt's positions come first")]),
        case=_offsets_case, call=lambda fn, p, n: [int(x) for x in fn(p, n)],
        solution="""def rope_offsets(prompt_len, forwards):
    return [0] + [prompt_len + k - 1 for k in range(1, forwards)]"""),
    Exercise(
        "08.4", "implement", "a function greedy(logits) returning a token id, from one forward's logits [positions, vocab]",
        ordered("tokens", "the next token is the largest logit of the *last* position",
                "one token per forward, in order",
                mistakes=[(lambda e, a: [int(np.argmax(l[0])) for l in a[0]],
                           "that reads the first position's logits: the next token comes from the last position")]),
        case=_tokens_case, call=lambda fn, logits: [int(fn(l)) for l in logits],
        solution="""def greedy(logits):
    return int(np.argmax(logits[-1]))      # temperature 0: the last position's largest logit"""),
)
