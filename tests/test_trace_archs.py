"""The tracer over every family's program: stepping equals the uncaptured forward, quantized
weights are hunted without false alarms."""
import numpy as np
import pytest

import workbench
import mlx.core as mx

from workbench import zoo
from workbench.program import execute

IDS = [2, 15, 16, 17, 18, 19]


@pytest.mark.parametrize("arch,kw", [
    ("llama", {}), ("qwen3", {}), ("gemma3_text", {}), ("gemma4_kv", {}),
    ("gemma4_moe", {"dtype": "float32"}), ("gemma4_text", {"quant": "affine4"}), ("qwen3", {"quant": "mxfp4"}),
])
def test_step_by_step_equals_execute(tmp_path, arch, kw):
    m = workbench.load(zoo.build(arch, tmp_path / arch, **kw))
    ref = execute(m.program, m.context(), m.feeds(mx.array([IDS])))["logits"][0]
    t = workbench.trace(m, IDS, capture="full")
    while not t.done:
        t.step()
    assert np.array_equal(np.array(t.logits[0].astype(mx.float32)), np.array(ref.astype(mx.float32)))
    assert [s.name for s in t.steps] == m.program.names
    assert all(s.stats is not None and not s.nonfinite for s in t.steps)
    # weight-bearing ops are named by their module path: the hunt can read their tensors
    lin = [s for s in t.steps if s.kind == "linear"]
    assert lin and all(t.op_tensors(s.name) for s in lin)
    assert t.first_nonfinite() is None
