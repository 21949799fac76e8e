"""Half-precision fidelity: our bfloat16 / float16 logits are no further from our float32
logits than mlx-lm's half-precision logits are from its float32 logits (same checkpoint),
on two architectures; and every floating op still reports the requested dtype."""
from __future__ import annotations

from pathlib import Path

import pytest

import workbench
import mlx.core as mx
from mlx.utils import tree_map

from workbench import zoo

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"


def _ref_half_error(path: Path, ids: mx.array, dt) -> float:
    from mlx_lm.utils import load_model

    ref, _ = load_model(path)
    params = ref.parameters()
    cast = lambda d: tree_map(lambda p: p.astype(d) if mx.issubdtype(p.dtype, mx.floating) else p, params)  # noqa: E731
    ref.update(cast(mx.float32))
    r32 = ref(ids).astype(mx.float32)
    ref.update(cast(dt))
    rh = ref(ids).astype(mx.float32)
    return mx.abs(rh - r32).max().item()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("half")
    return {"gemma4_text (demo)": DEMO, "llama": zoo.build("llama", d / "llama", dtype="float32", tokenizer=False)}


@pytest.mark.parametrize("arch", ["gemma4_text (demo)", "llama"])
@pytest.mark.parametrize("dt", [mx.bfloat16, mx.float16])
def test_half_precision_no_worse_than_mlx_lm(checkpoints, arch, dt):
    path = checkpoints[arch]
    model = workbench.load(path)
    ids = mx.array([[(7 * i + 3) % model.vocab_size for i in range(48)]], mx.int32)
    o32 = model(ids, dtype="float32").astype(mx.float32)
    t = workbench.trace(model, ids[0], capture="stats", dtype=dt)
    t.run()
    oh = t.logits.astype(mx.float32)
    ours = mx.abs(oh - o32[0]).max().item()
    theirs = _ref_half_error(Path(path), ids, dt)
    assert ours > 0  # the half-precision forward really ran in half precision
    assert ours <= 1.5 * theirs + 1e-3, (arch, dt, ours, theirs)
    floating = [s for s in t.steps if s.dtype in ("float32", "bfloat16", "float16")]
    assert floating and all(s.dtype == str(dt).replace("mlx.core.", "") for s in floating), \
        sorted({(s.kind, s.dtype) for s in floating})
