"""Notebook 01 (tour): the exercises, their answers and their hints."""
from __future__ import annotations

import numpy as np

from workbench.exercises import fixtures as fx
from workbench.exercises.core import Exercise, Verdict, array, fields, ordered, register, value


def _next_token(prompt: str) -> str:
    tr = fx.trace(prompt)
    return fx.demo().decode([int(np.argmax(np.array(tr.logits[0, -1])))])


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _scores_case():
    tr = fx.trace()
    return (fx.v(tr, "layers.2.self_attn.scores"),), fx.v(tr, "layers.2.self_attn.softmax")


def _logits_case():
    logits = np.array(fx.trace(fx.GEN_PROMPT).logits[0, -1], dtype=np.float64)
    return (logits, 3), [int(i) for i in np.argsort(-logits)[:3]]



def _spaced(judge):
    """A token judge that counts the right word written without its leading space, and says so."""
    def j(answer, expected, args):
        v = judge(answer, expected, args)
        if v.ok and isinstance(answer, str) and answer != expected and answer.strip() == expected.strip():
            return Verdict(True, "right word (counted); but the token itself starts with a space, "
                                 "as the prompt's words do: write it with its leading space")
        return v
    return j

register(
    Exercise(
        "01.1", "predict", 'a token with its leading space, e.g. " apple"',
        _spaced(value("the copy task repeats the list: which word followed 'river' the first time?",
                      mistakes=[(" river", "that is the last word of the prompt: the model continues the list, it does not repeat the last word"),
                                (" apple", "that is where the list starts again: what came after 'river' in the first half?")])),
        expected=lambda: _next_token("apple river stone cloud tree | apple river"),
        solution="""t1 = workbench.trace(model, "apple river stone cloud tree | apple river")
t1.run()
model.decode([int(mx.argmax(t1.logits[0, -1]).item())])   # the word after 'river' in the first half:
# the induction head finds the earlier 'river' and copies the token that followed it"""),
    Exercise(
        "01.2", "predict", "a tuple of four numbers (batch, heads, query token, key token)",
        fields(("batch", "heads", "query tokens", "key tokens"),
               ("one prompt", "look at num_attention_heads", "count the prompt's tokens, <bos> included",
                "every token is also a key, <bos> included"),
               mistakes=[((1, 4, 5, 5), "you forgot <bos>: the tokenizer puts it first, and it is a query and a key too"),
                        ((1, 2, 6, 6), "2 is num_key_value_heads; every *query* head has its own softmax"),
                        ((4, 6, 6), "keep the batch axis first: trace values are [batch, ...]")]),
        expected=lambda: tuple(fx.trace("apple river stone | apple").value("layers.2.self_attn.softmax").shape),
        solution="""t2 = workbench.trace(model, "apple river stone | apple", capture="full"); t2.run()
tuple(t2.value("layers.2.self_attn.softmax").shape)
# one sequence, one softmax per query head, and a T x T grid: every token (<bos> included)
# is a query and a key; above the diagonal (the future) is masked to 0""",
        giveaways=("(1, 4, 6, 6)",)),
    Exercise(
        "01.3", "implement", "a function softmax(scores) returning an array of the same shape",
        array("heads", "each row (one query) must become weights that sum to 1: exponentiate, then divide by the row's sum",
              mistakes=[(lambda s: _softmax(s, axis=-2), "you normalised each *column*: a query's weights run along the last axis (keys)"),
                        (lambda s: np.exp(s - s.max(-1, keepdims=True)), "the exponentials are right; now divide each row by its sum"),
                        (lambda s: s, "that returns the scores unchanged")]),
        case=_scores_case,
        solution="""def softmax(scores):
    e = np.exp(scores - scores.max(-1, keepdims=True))   # minus the row's max: no overflow; masked keys give exp(-huge) = 0
    return e / e.sum(-1, keepdims=True)"""),
    Exercise(
        "01.4", "implement", "a function top_tokens(logits, k) returning a list of k token ids",
        ordered("token ids", "take the k largest logits of the row",
                "most likely first: sort by descending logit",
                mistakes=[(lambda e, a: [int(i) for i in np.argsort(a[0])[:a[1]]],
                           "those are the k *least* likely tokens: sort by -logits")]),
        case=_logits_case,
        solution="""def top_tokens(logits, k):
    return [int(i) for i in np.argsort(-logits)[:k]]     # largest logit first"""),
)
