"""Causal tools: which parts of a model make its prediction, tested by changing them.

Built only on the Trace API (``workbench.trace(model, ids, capture=..., interventions=[...])``
and its interventions), so every experiment is a traced run that can be stepped and drawn.

* ablation -- :func:`ablate` / :func:`ablate_heads`: zero, mean or resample a head
  (:func:`head`), an MLP output (:func:`mlp`) or a MoE expert (:func:`expert`) and
  measure a metric; :func:`ablation` gives the interventions themselves;
* activation patching -- :func:`activation_patching` (layer x position, on the residual
  stream or each block's output) and :func:`patch_heads` (layer x head), clean into corrupted;
* direct logit attribution -- :func:`direct_logit_attribution`: each layer's and each
  head's direct share of a logit (difference), the final norm linearised;
* induction heads -- :func:`induction_scores` on repeated random tokens.

Metrics: :func:`logit_diff`, :func:`token_prob`, :func:`next_token_prob`, or any
``f(logits [B, T, V]) -> float or [B]``.  Every result is a dataclass of numpy arrays
and labels with ``to_dict()``; the figures are in :mod:`workbench.plots.causal`.
Computations run in float32 unless ``dtype=`` says otherwise.  See docs/causal.md;
``python -m workbench.demo.study`` measures the demo's backup induction heads.
"""
from workbench.causal.ablation import (AblationResult, Site, ablate, ablate_heads, ablation, all_heads, expert, head,
                                       mlp)
from workbench.causal.attribution import DLAResult, direct_logit_attribution, frozen_rmsnorm
from workbench.causal.common import (Metric, ResidualChain, logit_diff, next_token_prob, residual_chain,
                                     token_prob)
from workbench.causal.induction import InductionResult, induction_scores, repeated_tokens
from workbench.causal.patching import PatchingResult, activation_patching, patch_heads

__all__ = ["ablate", "ablate_heads", "ablation", "AblationResult", "Site", "head", "mlp", "expert", "all_heads",
           "activation_patching", "patch_heads", "PatchingResult", "direct_logit_attribution", "DLAResult",
           "frozen_rmsnorm", "induction_scores", "InductionResult", "repeated_tokens", "Metric", "logit_diff",
           "token_prob", "next_token_prob", "residual_chain", "ResidualChain"]
