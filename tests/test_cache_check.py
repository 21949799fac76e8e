"""Cache consistency (workbench cache-check, workbench.cache_check): prefill(T-1) +
decode(1) through the KV cache against one forward, per layer at the last position; the
four op families with our cache, five mlx-lm architectures with mlx-lm's own cache, and a
planted off-by-one position in the decode (WORKBENCH_CACHE_PLANT) found at layers.0."""
import json
from pathlib import Path

import pytest

import workbench
from workbench import zoo
from workbench.cli import main
from workbench.trace.cache_check import PLANT_ENV, TOLERANCE, cache_check, tf32_status
from workbench.zoo import reference as zr

DEMO = str(Path(__file__).resolve().parents[1] / "assets" / "demo")
IDS = [2, 17, 99, 4, 250, 31, 8, 8, 120, 64, 3, 77]
OP_FAMILIES = ["gemma4_text", "gemma3_text", "qwen3", "llama"]
MODULE_ARCHS = ["mistral", "qwen2", "phi3", "mixtral", "gemma2"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache_check")
    out = {}
    for arch in OP_FAMILIES:
        path = zoo.build(arch, tmp / arch, dtype="float32")
        out[arch] = workbench.load(path)
        out[f"{arch}@path"] = path
    for arch in MODULE_ARCHS:
        path = zr.build(arch, tmp / f"ref-{arch}")
        out[f"ref-{arch}"] = workbench.load(path, granularity="module")
        out[f"ref-{arch}@path"] = path
    out["llama@module"] = workbench.load(out["llama@path"], granularity="module")
    return out


@pytest.fixture
def plant(monkeypatch):
    monkeypatch.delenv(PLANT_ENV, raising=False)
    return lambda: monkeypatch.setenv(PLANT_ENV, "position")


def _layers(model):
    n = model.num_layers if hasattr(model, "num_layers") else len(model.module()[0].layers)
    return [f"layers.{i}" for i in range(n)] + ["logits"]


CASES = [(a, "op") for a in OP_FAMILIES] + [(f"ref-{a}", "module") for a in MODULE_ARCHS] + [("llama@module", "module")]


@pytest.mark.parametrize("key,granularity", CASES)
def test_consistent(models, plant, key, granularity):
    model = models[key]
    r = cache_check(model, IDS)
    assert r.consistent and r.first is None and r.layer is None, r
    assert r.granularity == granularity and r.tokens == len(IDS)
    assert r.cache == ("our KVCache" if granularity == "op" else "mlx-lm's KVCache")
    assert [row["name"] for row in r.rows] == _layers(model)
    for row in r.rows:  # float32 on the CPU: rounding only, far inside the tolerance
        assert row["dtype"] == "float32" and row["ok"] and row["rel"] < 1e-5, row
    assert r.argmax["same"] and r.argmax["forward"] == r.argmax["cached"]
    assert r.tf32["applies"] is False and "not applicable" in r.tf32["note"]


@pytest.mark.parametrize("key,granularity", CASES)
def test_planted_position_bug_found_at_layer_0(models, plant, key, granularity):
    model = models[key]
    plant()
    r = cache_check(model, IDS)
    assert not r.consistent and r.first == "layers.0" and r.layer == 0, r
    assert r.plant == "position" and r.granularity == granularity
    row = r.rows[0]
    assert row["name"] == "layers.0" and not row["ok"] and row["rel"] > 10 * TOLERANCE["float32"]
    assert r.finding is row
    assert "inconsistent at layers.0" in repr(r)


def test_plant_leaves_the_model_as_it_was(models, plant, monkeypatch):
    plant()
    assert not cache_check(models["qwen3"], IDS).consistent
    monkeypatch.delenv(PLANT_ENV)
    assert "feeds" not in vars(models["qwen3"])  # (the shifted feeds were the plant's, and are gone)
    assert cache_check(models["qwen3"], IDS).consistent


def test_lower_precision_uses_its_tolerance(models, plant):
    r = cache_check(models["gemma4_text"], IDS, dtype="bfloat16")
    assert r.consistent
    assert {row["dtype"] for row in r.rows[:-1]} == {"bfloat16"}
    assert all(row["tolerance"] == TOLERANCE[row["dtype"]] for row in r.rows)
    plant()
    r = cache_check(models["gemma4_text"], IDS, dtype="bfloat16")
    assert r.first == "layers.0" and r.rows[0]["rel"] > TOLERANCE["bfloat16"]
    # a tighter tolerance of one's own flags what the default lets through
    r = cache_check(models["ref-phi3"], IDS, tolerance={"float32": 1e-12})
    assert r.rows[0]["tolerance"] == 1e-12 and not r.consistent and r.first == "layers.0"


def test_tf32_status():
    assert tf32_status("float32", 1e-3, device="cpu")["applies"] is False
    assert "Metal" in tf32_status("float32", None, device="metal")["note"]
    on = tf32_status("float32", 1e-3, device="cuda")
    assert on["applies"] and on["explains"] and "MLX_ENABLE_TF32=0" in on["note"]
    far = tf32_status("float32", 0.4, device="cuda")
    assert far["applies"] and not far["explains"] and "cannot explain" in far["note"]
    assert tf32_status("bfloat16", 1e-3, device="cuda")["applies"] is False


def test_tf32_off_by_environment(monkeypatch):
    monkeypatch.setenv("MLX_ENABLE_TF32", "0")
    s = tf32_status("float32", 1e-3, device="cuda")
    assert s == {"applies": False, "enabled": False, "explains": False, "note": s["note"]} and "off" in s["note"]


def test_python_errors(models, monkeypatch):
    m = models["llama"]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        cache_check(m, [5])
    with pytest.raises(ValueError, match="one sequence, not a batch of 2"):
        cache_check(m, [[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match="out of range for a vocabulary of 256"):
        cache_check(m, [1, 2, 999])
    with pytest.raises(ValueError, match="tolerance"):
        cache_check(m, IDS, tolerance={"float8": 1e-3})
    monkeypatch.setenv(PLANT_ENV, "nonsense")
    with pytest.raises(ValueError, match="WORKBENCH_CACHE_PLANT='nonsense'"):
        cache_check(m, IDS)


def test_lazy_export():
    assert workbench.cache_check is cache_check


# --------------------------------------------------------------------------- the command line

def _cli(capsys, *argv):
    rc = main(["cache-check", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_consistent_and_planted(models, plant, capsys):
    ids = ",".join(map(str, IDS))
    for key in ("qwen3@path", "ref-mixtral@path"):
        rc, out, err = _cli(capsys, models[key], "--ids", ids, "--json")
        doc = json.loads(out)
        assert rc == 0 and doc["consistent"] and doc["first"] is None and err == ""
        assert doc["tf32"]["applies"] is False and doc["rows"][-1]["name"] == "logits"
    plant()
    rc, out, err = _cli(capsys, models["ref-gemma2@path"], "--ids", ids, "--json")
    doc = json.loads(out)
    assert rc == 1 and not doc["consistent"] and doc["first"] == "layers.0" and doc["layer"] == 0
    assert doc["granularity"] == "module" and doc["plant"] == "position"
    rc, out, err = _cli(capsys, models["llama@path"], "--ids", ids)
    assert rc == 1 and out.startswith("inconsistent at layers.0:") and "BAD layers.0" in out


def test_cli_text_prompt_and_granularity(capsys):
    rc, out, err = _cli(capsys, DEMO, "--prompt", "anna has a red ball .")
    assert rc == 0 and out.startswith("consistent: prefill") and "TF32: not applicable" in out
    rc, out, err = _cli(capsys, DEMO, "--prompt", "anna has a red ball .", "--granularity", "module", "--json")
    assert rc == 0 and json.loads(out)["granularity"] == "module"


@pytest.mark.parametrize("argv,msg", [
    (["--ids", "5"], "at least 2 tokens"),
    (["--ids", "1,2,99999"], "out of range for a vocabulary"),
    (["--ids", "1,x"], "not an integer token id"),
])
def test_cli_bad_input_exits_2(models, capsys, argv, msg):
    rc, out, err = _cli(capsys, models["qwen3@path"], *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_cli_unusable_paths_exit_2(models, tmp_path, capsys):
    rc, out, err = _cli(capsys, tmp_path / "nowhere", "--ids", "1,2", "--json")
    assert rc == 2 and "no such file" in json.loads(out)["error"] and len(err.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    rc, out, err = _cli(capsys, tmp_path / "empty", "--ids", "1,2")
    assert rc == 2 and "cannot load" in err and len(err.strip().splitlines()) == 1
    bare = zoo.build("llama", tmp_path / "bare", tokenizer=False)
    rc, out, err = _cli(capsys, bare, "--prompt", "hello there")
    assert rc == 2 and "pass --ids" in err


def test_cli_bad_plant_exits_2(models, monkeypatch, capsys):
    monkeypatch.setenv(PLANT_ENV, "nonsense")
    rc, out, err = _cli(capsys, models["qwen3@path"], "--ids", "1,2,3")
    assert rc == 2 and PLANT_ENV in err
