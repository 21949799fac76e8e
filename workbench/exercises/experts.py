"""Notebook 07 (mixture of experts): the exercises, their answers and their hints."""
from __future__ import annotations

import numpy as np

from workbench.exercises import fixtures as fx
from workbench.exercises.core import RIGHT, Exercise, array, fields, partly, register, unordered, value, wrong


def _tr():
    return fx.trace(fx.RECALL_PROMPT, "experts")


def _last_token_experts():
    return [int(e) for e in np.array(_tr().value("layers.2.router.top_k"))[0, -1]]


def _banned() -> tuple[int, int]:
    """Notebook 07's intervention (expert 0's router score set to -10000 in every layer):
    (layer 0's slots of expert 0, experts per token)."""
    import mlx.core as mx

    from workbench.trace import patch, trace

    def ban_expert_0(scores):
        return mx.concatenate([mx.full(scores[..., :1].shape, -1e4, scores.dtype), scores[..., 1:]], axis=-1)

    t3 = trace(fx.experts(), fx.RECALL_PROMPT, capture=["layers.*.router.top_k"],
               interventions=[patch("layers.*.router.proj", ban_expert_0)])
    t3.run()
    k0 = np.array(t3.value("layers.0.router.top_k"))[0]
    return int((k0 == 0).sum()), int(k0.shape[-1])


def _route_case():
    tr = _tr()
    return (fx.v(tr, "layers.0.router.proj"), 2), np.array(tr.value("layers.0.router.top_k"))[0]


def _judge_route(got, want, args):
    got = np.asarray(got)
    if got.shape != want.shape:
        return wrong(f"your function returned shape {got.shape}; router.top_k has shape {want.shape} (tokens, k)")
    rows = [sorted(g.tolist()) == sorted(w.tolist()) for g, w in zip(got, want)]
    if all(rows):
        return RIGHT
    scores, k = args
    if np.array_equal(np.sort(got, -1), np.sort(np.argsort(scores, -1)[:, :k], -1)):
        return wrong("those are the k *lowest* scores: the router keeps the highest")
    if np.array_equal(np.sort(got, -1), np.sort(np.argsort(-np.abs(scores), -1)[:, :k], -1)):
        return wrong("the router compares the scores themselves, not their sizes: a large negative score loses")
    return partly(sum(rows), len(rows), "tokens", "per token, the indices of the k largest scores")


def _combine_case():
    tr = _tr()
    return (fx.v(tr, "layers.0.experts.switch_glu.down_proj"), fx.v(tr, "layers.0.router.weights")), \
        fx.v(tr, "layers.0.experts.combine")


register(
    Exercise(
        "07.1", "predict", "a list of two expert numbers, e.g. [0, 3]",
        unordered("experts", "the router keeps the two highest scores of the token's row, whatever their sign",
                  mistakes=[(lambda e, a: [int(i) for i in np.argsort(fx.v(_tr(), "layers.2.router.proj")[-1])[:2]],
                             "those are the two *lowest* scores: the router keeps the highest")]),
        expected=_last_token_experts,
        solution="""sorted(np.array(tr.value("layers.2.router.top_k"))[0, -1].tolist())
# the two largest scores of the row: top-k compares scores, not their signs or sizes"""),
    Exercise(
        "07.2", "predict", "a number",
        value("how many experts does the router pick per token (top_k_experts)?",
              mistakes=[(lambda e, a: fx.experts().config.get("num_experts"),
                         "that is how many experts there are; each token fills only the slots of the experts it is sent to")]),
        expected=lambda: int(fx.experts().config["top_k_experts"]),
        solution="""load.sum(1) / mask.astype(bool).sum()      # slots per real token, by layer
# every real token fills exactly top_k_experts slots per layer, however unbalanced the load"""),
    Exercise(
        "07.3", "predict", "a tuple (slots of expert 0, experts per token), e.g. (3, 1)",
        fields(("slots of expert 0", "experts per token"),
               ("where does a score of -10000 rank among the four experts?", "does banning an expert change k, the number top_k keeps?"),
               swapped="the right numbers in the wrong order: (slots of expert 0, experts per token)"),
        expected=_banned,
        solution="""banned = [patch("layers.*.router.proj", ban_expert_0)]
t3 = workbench.trace(model, prompt, capture=["layers.*.router.top_k"], interventions=banned)
t3.run()
k0 = np.array(t3.value("layers.0.router.top_k"))[0]          # [T, 2]
int((k0 == 0).sum()), int(k0.shape[-1])
# banning an expert does not take work away, it sends it to the next-best expert"""),
    Exercise(
        "07.4", "implement", "a function route(scores, k) returning the expert indices, [tokens, k]",
        _judge_route, case=_route_case,
        solution="""def route(scores, k):
    return np.argsort(-scores, axis=-1)[:, :k]     # per token, the k highest scores (any order)"""),
    Exercise(
        "07.5", "implement", "a function combine(outs, weights) returning the layer's expert output, [tokens, hidden]",
        array("tokens", "each token's output is its experts' outputs, weighted by its router weights and summed",
              mistakes=[(lambda o, w: o.mean(1), "that is the plain mean: weight each expert's output by its router weight"),
                        (lambda o, w: o.sum(1), "that sums the experts' outputs unweighted: multiply each by its router weight first"),
                        (lambda o, w: (o * w[..., None]).mean(1), "weighted, then averaged: the weights already mix the experts, so sum")],
              rtol=1e-4, atol=1e-5),
        case=_combine_case,
        solution="""def combine(outs, weights):
    return (outs * weights[..., None]).sum(axis=1)     # [T, k, D] x [T, k, 1] -> sum over the k experts"""),
)
