"""A family's knowledge is written once, in its file (workbench/checkpoint/families/<family>.py):
the config reader returns the family's Config, and the op program (workbench/models/<family>.py)
reads exactly the tensors its table lists (a name spelt differently in the program and the
table fails here)."""
from __future__ import annotations

import pytest

import workbench
import workbench.models as M
from workbench import zoo
from workbench.checkpoint.arch import build_arch
from workbench.zoo.configs import ARCHS, base_config


@pytest.mark.parametrize("arch", ARCHS)
def test_the_reader_returns_the_family_config(arch):
    a = build_arch(base_config(arch))
    assert type(a.spec) is M.FAMILIES[a.family].Config
    assert a.num_layers == a.spec.num_hidden_layers and a.tied == a.spec.tie_word_embeddings


@pytest.mark.parametrize("arch", ARCHS)
def test_the_program_reads_the_table(arch, tmp_path):
    m = workbench.load(zoo.build(arch, tmp_path / arch, dtype="float32"), attention="explicit")
    stored = set(m.tensor_names)
    expected = {n for n, e in m.checkpoint.arch.expected.items() if n in stored and not e.ignored_if_present}
    read = {n for op in m.program.ops for n in m.op_tensor_names(op)}
    assert read == expected, (sorted(read - expected), sorted(expected - read))
