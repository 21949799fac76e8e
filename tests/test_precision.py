"""Float32 means float32 (issue 28 item 3): the matmul precision a trace, a hunt's float32
recompute and a dump ran under, MLX_ENABLE_TF32 set off for the reference and put back, and
diff's warning when the two sides ran under different precision.  The CUDA figures (TF32 on /
off against the CPU) are in benchmarks/README.md; here the CPU path and the switch's logic."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

import workbench
import mlx.core as mx

from workbench import precision, zoo
from workbench.cli import main
from workbench.diff import readers
from workbench.diff.api import META_PRECISION, Reference, compare
from workbench.notebook import planted

IDS = [2, 15, 16, 17, 18, 19, 20, 21]
IDS_ARG = ",".join(map(str, IDS))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return Path(zoo.build("gemma4_text", tmp_path_factory.mktemp("prec") / "ck", dtype="float32"))


@pytest.fixture(scope="module")
def ref_dump(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("prec_dump") / "ref.safetensors"
    assert main(["dump", str(ckpt), "--ids", IDS_ARG, "--out", str(out)]) == 0
    return out


@pytest.fixture
def env(monkeypatch):
    """MLX_ENABLE_TF32 as the test sets it, whatever the runner's environment holds."""
    monkeypatch.delenv(precision.ENV, raising=False)
    return monkeypatch


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU path of the switch on a machine without one: a GPU device, and MLX's
    choice already made (what the probe would have found)."""
    monkeypatch.setattr(precision, "_on_cpu", lambda device=None: False)

    def set_probed(value):
        monkeypatch.setattr(precision, "_probed", value)
    return set_probed


# --------------------------------------------------------------------------- on the CPU

def test_cpu_trace_records_cpu_precision_and_float32_is_exact(ckpt):
    m = workbench.load(ckpt)
    for dtype in ("float32", "bfloat16"):
        tr = workbench.trace(m, IDS, dtype=dtype)
        tr.run()
        assert tr.matmul_precision == precision.CPU == "n/a (cpu)"
    assert precision.matmul_precision() == precision.CPU
    with precision.exact_float32() as p:
        assert p == precision.CPU
    # the probe's product is exact in float32 on the CPU: (1 + 2^-12) x 64 = 64 + 2^-6 (TF32 would give 64)
    with mx.stream(mx.cpu):
        a = mx.full((64, 64), 1 + 2.0**-12, mx.float32)
        assert (a @ mx.ones((64, 64), mx.float32))[0, 0].item() == 64 + 2.0**-6


def test_hunt_float32_recompute_records_its_precision(tmp_path):
    clean = zoo.build("gemma4_text", tmp_path / "clean", dtype="float32")

    def overflow(ts):  # layer 1's MLP passes 65504 in float16, finite in float32
        for n in ("layers.1.mlp.up_proj.weight", "layers.1.mlp.gate_proj.weight"):
            (k,) = [k for k in ts if k.endswith(n)]
            ts[k] = ts[k] * 1000

    m = workbench.load(planted(Path(clean), tmp_path / "overflow", overflow))
    r = workbench.trace.hunt(m, IDS, dtype="float16")
    f = r.report["first_nonfinite"]
    assert f["cause"] == "overflow" and f["float32_absmax"] > 65504
    assert f["float32_precision"] == "n/a (cpu)"


# --------------------------------------------------------------------------- the switch

@pytest.mark.parametrize("before", [None, "1", "0", "yes"])
def test_tf32_setting_restores_the_users_value(env, before):
    if before is not None:
        env.setenv(precision.ENV, before)
    with precision.tf32_setting("0"):
        assert os.environ[precision.ENV] == "0"
    assert os.environ.get(precision.ENV) == before
    with pytest.raises(RuntimeError):
        with precision.tf32_setting(None):
            assert precision.ENV not in os.environ
            raise RuntimeError("inside")
    assert os.environ.get(precision.ENV) == before  # also after an exception


@pytest.mark.parametrize("before", [None, "1"])
def test_exact_float32_sets_tf32_off_on_a_gpu_and_puts_it_back(env, fake_gpu, before):
    if before is not None:
        env.setenv(precision.ENV, before)
    fake_gpu("float32")
    seen = []
    with precision.exact_float32() as p:
        seen.append((os.environ.get(precision.ENV), p))
    assert seen == [("0", "float32")]
    assert os.environ.get(precision.ENV) == before


def test_exact_float32_says_tf32_when_the_process_already_fixed_it(env, fake_gpu):
    fake_gpu("tf32")  # MLX read MLX_ENABLE_TF32=1 at an earlier float32 matmul: setting it now changes nothing
    with precision.exact_float32() as p:
        assert p == "tf32"
    assert precision.ENV not in os.environ
    assert precision.matmul_precision(mx.float32) == "tf32"
    assert precision.matmul_precision(mx.bfloat16) == "n/a (bfloat16)"  # TF32 concerns float32 only


def test_differs_only_where_tf32_meets_something_else():
    assert precision.differs("tf32", "float32") and precision.differs("n/a (cpu)", "tf32")
    assert precision.differs("tf32", "n/a (bfloat16)")
    assert not precision.differs("tf32", "tf32")
    assert not precision.differs("float32", "n/a (cpu)")  # both full float32
    assert not precision.differs("float32", "n/a (bfloat16)")
    assert not precision.differs("tf32", None) and not precision.differs(None, "tf32")  # unknown: no claim
    w = precision.warning("float32", "tf32")
    assert "\n" not in w and "float32" in w and "tf32" in w and precision.ENV in w


# --------------------------------------------------------------------------- dump and diff

def test_dump_metadata_carries_the_precision(ckpt, ref_dump, tmp_path, capsys):
    _, meta = readers.read_safetensors(ref_dump)
    assert meta[META_PRECISION] == "n/a (cpu)"
    assert Reference.load(ref_dump).matmul_precision == "n/a (cpu)"
    out = tmp_path / "b.safetensors"
    capsys.readouterr()
    assert main(["dump", str(ckpt), "--ids", IDS_ARG, "--out", str(out), "--dtype", "bfloat16", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["matmul_precision"] == "n/a (cpu)"
    assert readers.read_safetensors(out)[1][META_PRECISION] == "n/a (cpu)"


def _relabel(src, dst, precision_label):
    """A copy of dump ``src`` whose metadata says it ran under ``precision_label`` (None: the key left out)."""
    values, meta = readers.read_safetensors(src)
    meta = dict(meta)
    if precision_label is None:
        meta.pop(META_PRECISION)
    else:
        meta[META_PRECISION] = precision_label
    order = json.loads(meta[readers.META_ORDER])
    readers.write_dump(dst, values, order, meta)
    return dst


def test_diff_warns_when_the_engine_ran_under_tf32(ref_dump, tmp_path, capsys):
    eng = _relabel(ref_dump, tmp_path / "eng_tf32.safetensors", "tf32")
    capsys.readouterr()
    main(["diff", str(ref_dump), str(eng), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["matmul_precision"] == {"reference": "n/a (cpu)", "engine": "tf32"}
    assert d["precision_warning"] and "tf32" in d["precision_warning"] and "n/a (cpu)" in d["precision_warning"]
    main(["diff", str(ref_dump), str(eng)])
    text = capsys.readouterr().out.splitlines()
    warned = [ln for ln in text if ln.startswith("warning: matmul precision differs")]
    assert len(warned) == 1 and warned[0] == "warning: " + d["precision_warning"]


def test_diff_warns_when_the_reference_dump_ran_under_tf32(ref_dump, tmp_path):
    ref = _relabel(ref_dump, tmp_path / "ref_tf32.safetensors", "tf32")
    eng = _relabel(ref_dump, tmp_path / "eng.safetensors", "float32")
    r = compare(str(ref), str(eng), local=False)
    assert r.precision == {"reference": "tf32", "engine": "float32"}
    assert r.precision_warning is not None and r.precision_warning.startswith("matmul precision differs")


@pytest.mark.parametrize("label", ["n/a (cpu)", "float32", "n/a (bfloat16)", None])
def test_diff_is_quiet_when_neither_side_ran_tf32(ref_dump, tmp_path, label):
    eng = _relabel(ref_dump, tmp_path / "eng.safetensors", label)
    r = compare(str(ref_dump), str(eng), local=False)
    assert r.precision == {"reference": "n/a (cpu)", "engine": label}
    assert r.precision_warning is None
    assert "matmul precision" not in r.summary()


def test_diff_against_the_checkpoint_records_the_reference_run(ckpt, ref_dump, tmp_path):
    eng = _relabel(ref_dump, tmp_path / "eng_tf32.safetensors", "tf32")
    r = compare(str(ckpt), str(eng), ids=IDS, local=False)
    assert r.precision["reference"] == "n/a (cpu)" and r.precision_warning is not None
