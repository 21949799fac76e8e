"""Issue 33, items 4, 5, 6 and 8 (arguments): the lab trusts only its committed notebooks,
names from files print escaped, model_type is a plain model name, the BLAS loader never reads
the working directory, user regexes and rule lists are bounded, every argument error is one
line with exit 2."""
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import pytest

from workbench import lab, notebook, registry
from workbench.cli import main
from workbench.errors import parse_ids, printable, UsageError
from workbench.patterns import MAX_RULES, PatternError, UserRegex

REPO = lab.REPO_ROOT
DEMO = REPO / "assets" / "demo"
PY = sys.executable


def one_line_2(capsys, argv, *words):
    """main(argv) exits 2 with exactly one line on stderr holding every word; returns it."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- item 4: the lab

def test_manifest_lists_exactly_the_committed_notebooks():
    assert notebook.manifest_out_of_date(lab.NOTEBOOKS) is None
    names = lab.read_manifest()
    assert sorted(names) == sorted(p.name for p in lab.NOTEBOOKS.glob("*.ipynb"))
    r = subprocess.run([PY, "-m", "workbench.notebook", "check"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def test_lab_trusts_no_symlink_and_no_stranger(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    root = tmp_path / "nb"
    root.mkdir()
    shutil.copy(lab.NOTEBOOKS / "01_tour.ipynb", root / "01_tour.ipynb")
    evil = tmp_path / "elsewhere" / "evil.ipynb"
    evil.parent.mkdir()
    shutil.copy(lab.NOTEBOOKS / "02_weights.ipynb", evil)       # even the bytes of a committed one
    os.symlink(evil, root / "02_weights.ipynb")                 # under a committed name: a symlink
    os.symlink(lab.NOTEBOOKS / "03_forward_pass.ipynb", root / "zz.ipynb")   # an unknown name
    text = (lab.NOTEBOOKS / "04_nan_hunt.ipynb").read_text()
    (root / "04_nan_hunt.ipynb").write_text(text.replace("NaN", "NaN!", 1))  # changed content
    assert lab.trust_notebooks(root) == ["01_tour.ipynb"]
    err = capsys.readouterr().err
    assert "02_weights.ipynb: not trusted, a symlink" in err
    assert "zz.ipynb: not trusted, not one of the committed notebooks" in err
    assert "04_nan_hunt.ipynb: not trusted, its content differs" in err
    assert lab.trust_notebooks(root) == []             # already signed: nothing new


def test_lab_json_lists_only_what_it_would_trust(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lab, "NOTEBOOKS", tmp_path)
    shutil.copy(REPO / "notebooks" / "01_tour.ipynb", tmp_path / "01_tour.ipynb")
    os.symlink(REPO / "notebooks" / "02_weights.ipynb", tmp_path / "02_weights.ipynb")
    assert main(["lab", "--dry-run", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["notebooks"] == ["01_tour.ipynb", "02_weights.ipynb"]
    assert info["trusted"] == ["01_tour.ipynb"]


# ---------------------------------------------------------------- item 5: escaped names

def _safetensors(path, names):
    header, off = {}, 0
    for n in names:
        header[n] = {"dtype": "F32", "shape": [2], "data_offsets": [off, off + 8]}
        off += 8
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * off)


FORGED = "x\n  OK: no errors\x1b[2K\r\x1b[1A\u202e"


def test_inspect_prints_a_forged_name_escaped(tmp_path, capsys):
    f = tmp_path / "m.safetensors"
    _safetensors(f, ["model.embed_tokens.weight", FORGED])
    rc = main(["inspect", str(f), "--tensors"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert r"x\n  OK: no errors\x1b[2K\r\x1b[1A\u202e" in out
    assert [ln for ln in out.splitlines() if ln.strip().startswith("OK")] == \
        ([ln for ln in out.splitlines()][-1:] if rc == 0 else [])


def test_text_renderers_escape_names():
    from workbench.checkpoint.render import render_diff
    d = {"a": "a", "b": "b", "model_type": ["llama", "llama"], "only_a": [FORGED], "only_b": [],
         "shape": [], "dtype": [], "quantization": [], "same": False}
    text = render_diff(d)
    assert text.splitlines()[-1] == "  differ" and "\x1b" not in text and len(text.splitlines()) == 5
    assert printable("a\nb\x1b[0m") == r"a\nb\x1b[0m" and printable("plain é") == "plain é"


def test_main_escapes_an_error_message(capsys, tmp_path):
    line = one_line_2(capsys, ["inspect", str(tmp_path / "a\x1b[2Kb\rOK")])
    assert "\x1b" not in line and "\r" not in line and r"a\x1b[2Kb\rOK" in line


BAD_TYPES = ["base", "cache", "mla", "rope_utils", "switch_layers", ".", "..", "llama.os",
             "gemma4.processing_gemma4", "__init__", "a/b", "x" * 500, "llama\n", ""]


@pytest.mark.parametrize("mt", BAD_TYPES)
def test_model_type_must_name_a_model(mt):
    for cfg, lib in (({"model_type": mt}, None), ({"model_type": mt, "vision_config": {}}, None),
                     ({"model_type": mt}, "mlx_vlm")):
        try:
            registry.reference_for(cfg, lib)
        except (ValueError, ImportError) as e:
            assert len(str(e).splitlines()) == 1 and len(str(e)) < 400
        else:
            pytest.fail(f"{mt!r} accepted")
    assert not registry.known({"model_type": mt})


def test_model_type_refused_before_any_import():
    code = ("import sys; from workbench import registry\n"
            "for mt in ('gemma4.processing_gemma4', 'llama.os', 'mla', 'gemma4.processing_gemma4'):\n"
            "    for lib in (None, 'mlx_vlm'):\n"
            "        try: registry.reference_for({'model_type': mt, 'vision_config': {}}, lib)\n"
            "        except Exception: pass\n"
            "bad = [m for m in sys.modules if m.endswith(('processing_gemma4', 'models.mla', 'llama.os'))]\n"
            "print(bad)")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    with pytest.raises(ValueError, match="no model 'base'"):
        registry.import_reference("mlx_lm", "base")
    with pytest.raises(ValueError, match="not one of"):
        registry.import_reference("os", "path")
    assert registry.reference_for({"model_type": "mistral"}) == ("mlx_lm", "llama")
    assert registry.lm_module("gemma3n_text") == "gemma3n"


@pytest.mark.parametrize("mt", ["base", "mla", "llama.os", ".."])
def test_inspect_with_a_crafted_model_type_gives_no_traceback(tmp_path, mt):
    d = tmp_path / "ck"
    shutil.copytree(DEMO, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = mt
    (d / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([PY, "-m", "workbench.cli", "inspect", str(d)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    # nothing builds it, so workbench.load refuses it: a bad-config error, exit 1 -- never "OK" (issue 41)
    assert r.returncode == 1 and "error   bad-config" in r.stdout and "OK" not in r.stdout, r.stdout + r.stderr
    assert f"model_type {mt!r} is not a supported family" in r.stdout, r.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loader acts on Linux only")
@pytest.mark.parametrize("how", ["-m", "-c"])
def test_blas_never_loads_from_the_working_directory(tmp_path, how):
    """Run as ``python -m`` (the form mlx.launch uses) or ``-c``, the working directory is first
    on sys.path; a ./cmeel.prefix/lib/libopenblas.so.0 there (a loadable copy of the real
    library where there is one, so only the rule keeps it out) is never a candidate nor loaded."""
    import workbench._blas as blas
    fake = tmp_path / "cmeel.prefix" / "lib"
    fake.mkdir(parents=True)
    real = blas.STATUS.get("loaded")
    if real and os.path.isabs(real) and os.path.isfile(real):
        shutil.copy(real, fake / "libopenblas.so.0")
    else:
        (fake / "libopenblas.so.0").write_bytes(b"\x7fELF not really")
    probe = ("import json, sys, workbench._blas as b\n"
             "print(json.dumps({'c': b._candidates(), 's': b.ensure_fast_blas(), 'p0': __import__('os').path.realpath(sys.path[0] or '.')}))\n")
    (tmp_path / "blasprobe.py").write_text(probe)
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_BLAS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)
    argv = [PY, "-m", "blasprobe"] if how == "-m" else [PY, "-c", probe]
    here = os.path.realpath(tmp_path)
    for blas_env in (None, "cmeel.prefix/lib/libopenblas.so.0"):   # a relative WORKBENCH_BLAS too
        if blas_env:
            env["WORKBENCH_BLAS"] = blas_env
        r = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["p0"] == here   # the working directory is on sys.path...
        loaded = got["s"]["loaded"]                          # ...and nothing is loaded from it
        assert loaded is None or not os.path.realpath(loaded).startswith(here), got
        if blas_env is None:
            assert not any(os.path.realpath(c).startswith(here) for c in got["c"] if os.sep in c), got
        else:
            assert any("relative path" in t for t in got["s"]["tried"]), got


# ---------------------------------------------------------------- item 6: bounded patterns

def _bounded(code, seconds=30, mb=600):
    """Run ``code`` in a fresh interpreter; its peak RSS and time stay under the bounds."""
    # (the peak of this process since its exec: /proc's VmHWM, kB; ru_maxrss would carry the
    #  forked parent's size across exec on Linux, a pytest process of a full run included)
    wrap = code + ("\nimport re, resource\ntry:\n    hwm = int(re.search(r'VmHWM:\\s*(\\d+)', "
                   "open('/proc/self/status').read()).group(1))\nexcept OSError:\n"
                   "    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\nprint('RSS', hwm)")
    t = time.monotonic()
    r = subprocess.run([PY, "-c", wrap], capture_output=True, text=True, timeout=seconds * 4)
    took = time.monotonic() - t
    assert took < seconds, took
    rss_kb = int(r.stdout.rsplit("RSS", 1)[1])
    assert rss_kb < mb * 1024, rss_kb
    return r


@pytest.mark.parametrize("pat", ["a{1000000000}", "a{5,1000000000}", "(?:(?:(?:a{90}){90}){90}){90}",
                                 "x{99999999999999999999999}", "[ab]{100001}"])
def test_huge_repeat_refused_in_bounded_time_and_memory(pat):
    code = (f"from workbench.patterns import UserRegex, PatternError\n"
            f"try:\n    UserRegex({pat!r}, 'pattern')\nexcept PatternError as e:\n    print('ERR', e)\n")
    r = _bounded(code, seconds=20, mb=400)
    assert "ERR" in r.stdout and ("repeat count" in r.stdout or "unrolls" in r.stdout), r.stdout


def test_ordinary_patterns_still_compile():
    for p in [r"^blk\.(\d+)\.", r"a{3}", r"[a-z]{2,}", r"\{100000000\}", r"(a{100}){100}", r"[{]{5}", "x{}"]:
        UserRegex(p)
    assert UserRegex(r"layers\.(\d+)\.x{2}").fullmatch("layers.3.xx")


@pytest.mark.parametrize("flag", ["--ops", "--capture"])
def test_cli_pattern_refused_in_one_line(capsys, tmp_path, flag):
    if flag == "--ops":
        argv = ["dump", str(DEMO), "--ids", "1,2", "--out", str(tmp_path / "o.safetensors"), "--ops", "re:a{1000000000}"]
    else:
        argv = ["distributed", str(DEMO), "--ids", "1,2", "--capture", "re:a{1000000000}"]
    t = time.monotonic()
    rc = main(argv)
    err = capsys.readouterr().err
    assert time.monotonic() - t < 60
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "repeat count" in err, err


def test_map_rules_bounded(tmp_path, capsys):
    big = tmp_path / "big.json"
    big.write_text(json.dumps([["a{1000000000}", "x"]]))
    one_line_2(capsys, ["diff", str(DEMO), str(DEMO / "model.safetensors"), "--ids", "1,2", "--map", str(big)],
               "repeat count")
    many = tmp_path / "many.json"
    many.write_text(json.dumps([[f"^n{i}$", "x"] for i in range(200_000)]))
    t = time.monotonic()
    one_line_2(capsys, ["diff", str(DEMO), str(DEMO / "model.safetensors"), "--ids", "1,2", "--map", str(many)],
               f"more than {MAX_RULES} rules")
    assert time.monotonic() - t < 30


def test_rules_share_one_time_budget(monkeypatch):
    from workbench import patterns
    from workbench.diff.naming import RulesError, apply_rules, compile_rules
    monkeypatch.setattr(patterns, "TOTAL_BUDGET", 0.2)
    rules = compile_rules([[f"^(a|a)*q{i}$", "x"] for i in range(MAX_RULES)])
    assert rules[0][0].budget is rules[-1][0].budget
    t = time.monotonic()
    with pytest.raises(RulesError, match="all rules together"):
        for _ in range(10_000):
            apply_rules("a" * 18, rules)
    assert time.monotonic() - t < 20


# ---------------------------------------------------------------- item 8: arguments

@pytest.mark.parametrize("argv,words", [
    (["diff", "D", "E", "--ids", "1", "--max-nmse", "-1"], ["--max-nmse", "-1", ">= 0"]),
    (["diff", "D", "E", "--ids", "1", "--noise-factor", "-1"], ["--noise-factor", "> 0"]),
    (["diff", "D", "E", "--ids", "1", "--min-cosine", "2"], ["--min-cosine", "<= 1"]),
    (["diff", "D", "E", "--ids", "1", "--max-abs", "nan"], ["--max-abs"]),
    (["diff", "D", "E", "--ids", "1", "--min-cosine", "\u0660.5"], ["--min-cosine"]),
    (["inspect"], ["required", "path"]),
    (["inspect", "x", "--bogus"], ["unrecognized", "--bogus"]),
    (["nosuchcommand"], ["invalid choice"]),
    (["hunt", "x", "--ids", "1", "--prompt", "a"], ["not allowed"]),
    (["hunt", "x", "--ids", "1", "--top", "-1"], ["--top"]),
    (["hunt", "x", "--ids", "1", "--top", "\u0663"], ["--top"]),
    (["hazards", "x", "--max", "-2"], ["--max"]),
    (["demo", "--n", "0"], ["--n"]),
    (["lab", "--port", "\u0663", "--dry-run"], ["--port"]),
    (["lab", "--port", "70000", "--dry-run"], ["--port"]),
    (["diff", "D", "E", "--min-cosine", "0.5\n\x1b[2Kfake"], ["--min-cosine"]),
])
def test_argument_errors_are_one_line(capsys, argv, words):
    line = one_line_2(capsys, argv, *words)
    assert "usage:" not in line and "\x1b" not in line


@pytest.mark.parametrize("text,word", [("1,,2", "empty id"), ("1,", "empty id"), ("\u0661\u0662", "ASCII digits"),
                                       ("\uff11,2", "ASCII digits"), ("1_0", "ASCII digits"), ("-3", "negative"),
                                       ("+3", "ASCII digits"), ("9" * 40, "digits long"), ("", "empty")])
def test_ids_refused(text, word):
    with pytest.raises(UsageError, match=word):
        parse_ids(text)


def test_ids_accepted():
    assert parse_ids("2,15,16") == [2, 15, 16]
    assert parse_ids(" 2 , 15 16") == [2, 15, 16]


def test_ids_on_the_command_line(capsys, tmp_path):
    one_line_2(capsys, ["diff", str(DEMO), str(tmp_path / "e.npz"), "--ids", "1,,2"], "empty id")
    one_line_2(capsys, ["hunt", str(DEMO), "--ids", "\u0661,2"], "ASCII digits")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_tokenizer_is_named_as_a_fifo(tmp_path, capsys):
    d = tmp_path / "ck"
    shutil.copytree(DEMO, d)
    (d / "tokenizer.json").unlink()
    os.mkfifo(d / "tokenizer.json")
    one_line_2(capsys, ["dump", str(d), "--prompt", "hi", "--out", str(tmp_path / "o.safetensors")], "FIFO")
    one_line_2(capsys, ["hunt", str(d), "--prompt", "hi"], "FIFO")


def test_index_outside_the_directory_says_so(tmp_path, capsys):
    d = tmp_path / "ck"
    d.mkdir()
    shutil.copy(DEMO / "config.json", d / "config.json")
    shutil.copy(DEMO / "model.safetensors", tmp_path / "outside.safetensors")
    h = json.loads((tmp_path / "outside.safetensors").read_bytes()[8:8 + struct.unpack(
        "<Q", (tmp_path / "outside.safetensors").read_bytes()[:8])[0]])
    wm = {k: "../outside.safetensors" for k in h if k != "__metadata__"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    line = one_line_2(capsys, ["inspect", str(d)], "escapes the checkpoint directory", "outside.safetensors")
    assert "names no shard files" not in line
