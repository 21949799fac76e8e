"""Token ids are checked wherever they enter (issue 33, item 2): trace (both granularities),
generate, the causal metrics and tools.  An id is an integer (Python or numpy, never a
boolean or a float) in [0, vocab_size); anything else is one ValueError / TypeError line
naming the id (and the vocabulary, once the model is known), raised before any gather:
MLX gathers do not check bounds, so an unchecked id reads garbage or kills the process.

The repros that crashed or read out of bounds run in a subprocess (a regression then fails
the test instead of killing pytest), and so do the hypothesis properties over ids."""
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import workbench  # noqa: I001 - before mlx.core (workbench picks MLX's BLAS)
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from workbench import causal as C
from workbench.demo import paths
from workbench.trace.step import TraceError

VOCAB = 522  # the demo's
ROOT = Path(__file__).resolve().parents[1]


def _subprocess(code: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# each case: (name, python expression run on m (op program), mm (module level), ids (a prompt))
REPROS = [
    ("ablate logit_diff(522)", "C.ablate(m, ids, [C.head(0, 0)], metric=C.logit_diff(522))"),
    ("ablate logit_diff(600)", "C.ablate(m, ids, [C.head(0, 0)], metric=C.logit_diff(600))"),
    ("ablate logit_diff(-523)", "C.ablate(m, ids, [C.head(0, 0)], metric=C.logit_diff(-523))"),
    ("ablate logit_diff(10**9)", "C.ablate(m, ids, [C.head(0, 0)], metric=C.logit_diff(10**9))"),
    ("ablate logit_diff(3, 10**9)", "C.ablate(m, ids, [C.head(0, 0)], metric=C.logit_diff(3, 10**9))"),
    ("ablate token_prob(10**9)", "C.ablate(m, ids, [C.head(0, 0)], metric=C.token_prob(10**9))"),
    ("patching logit_diff(10**9)", "C.activation_patching(m, ids, ids[:-1] + [5], metric=C.logit_diff(10**9))"),
    ("patch_heads logit_diff(3, 600)", "C.patch_heads(m, ids, ids[:-1] + [5], metric=C.logit_diff(3, 600))"),
    ("dla answer=10**9", "C.direct_logit_attribution(m, ids, answer=10**9)"),
    ("dla wrong=-1", "C.direct_logit_attribution(m, ids, answer=3, wrong=-1)"),
    ("induction sep=10**9", "C.induction_scores(m, sep=10**9)"),
    ("induction pool with 600", "C.induction_scores(m, pool=list(range(3, 12)) + [600])"),
    ("next_token_prob 10**9",
     "C.ablate(m, ids, [C.head(0, 0)], metric=C.next_token_prob(ids[:-1] + [10**9], [len(ids) - 2]))"),
    ("metric logit_diff(10**9) on logits alone", "C.logit_diff(10**9)(mx.zeros((1, 3, 522)))"),
    ("trace [10**30] op", "workbench.trace(m, [10**30]).run()"),
    ("trace [10**30] module", "workbench.trace(mm, [10**30]).run()"),
    ("trace [600] op", "workbench.trace(m, [2, 600]).run()"),
    ("trace [-1] module", "workbench.trace(mm, [2, -1]).run()"),
    ("trace int64 2**32+5 op", "workbench.trace(m, mx.array([2, 2**32 + 5], dtype=mx.int64)).run()"),
    ("trace uint64 2**32+5 module", "workbench.trace(mm, np.array([2, 2**32 + 5], dtype=np.uint64)).run()"),
    ("trace batch [[2, 3], [2, 10**9]] op", "workbench.trace(m, [[2, 3], [2, 10**9]]).run()"),
    ("trace pad_id=10**9 op", "workbench.trace(m, [[2, 3, 4], [2, 3]], pad_id=10**9).run()"),
    ("generate [10**30] op", "workbench.generate(m, [10**30], max_tokens=2)"),
    ("generate [600] module", "workbench.generate(mm, [2, 600], max_tokens=2)"),
    ("generate stop=[10**9]", "workbench.generate(m, ids, max_tokens=2, stop=[10**9])"),
]


@pytest.fixture(scope="module")
def repro_results():
    code = f"""
        import json
        import workbench
        import mlx.core as mx, numpy as np
        from workbench import causal as C
        m = workbench.load({str(paths.DEMO)!r})
        mm = workbench.load({str(paths.DEMO)!r}, granularity="module")
        ids = m.encode("apple river stone cloud tree | stone")
        out = {{}}
        for name, expr in {REPROS!r}:
            try:
                r = eval(expr)
                out[name] = ["returned", repr(r)[:300]]
            except Exception as e:
                out[name] = [type(e).__name__, str(e)]
            print(name, flush=True)
        print("RESULT " + json.dumps(out))
    """
    r = _subprocess(code)
    assert r.returncode == 0, \
        f"the repros killed the process (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, r.stdout + r.stderr
    return json.loads(line[0][len("RESULT "):])


def _expected_id(name: str) -> str:
    for s in ("10**30", "10**9", "2**32+5", "-523", "600", "522", "-1"):
        if s in name:
            return {"10**30": str(10**30), "10**9": str(10**9), "2**32+5": str(2**32 + 5)}.get(s, s)
    raise AssertionError(name)


@pytest.mark.parametrize("name", [n for n, _ in REPROS])
def test_repro_is_one_line_naming_the_id_and_vocabulary(repro_results, name):
    kind, msg = repro_results[name]
    assert kind == "ValueError", (name, kind, msg)
    assert "\n" not in msg, msg
    assert _expected_id(name) in msg, msg
    assert f"vocabulary of {VOCAB}" in msg, msg


# --------------------------------------------------------------------------- in process (cannot gather out of bounds)

@pytest.fixture(scope="module")
def demo():
    return workbench.load(paths.DEMO)


@pytest.fixture(scope="module")
def demo_module():
    return workbench.load(paths.DEMO, granularity="module")


@pytest.fixture(scope="module", params=["op", "module"])
def model(request, demo, demo_module):
    return demo if request.param == "op" else demo_module


def _logits(model, ids) -> np.ndarray:
    t = workbench.trace(model, ids, capture=None, dtype="float32")
    t.run()
    return np.array(t.logits)


def _one_line(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for p in parts:
        assert p in msg, msg
    return msg


@pytest.mark.parametrize("make", [lambda: np.array([True, False]), lambda: mx.array([True, False]),
                                  lambda: [True, False], lambda: [[2, 3], [2, True]]])
def test_booleans_are_not_token_ids(model, make):
    with pytest.raises(TypeError) as e:
        model.trace(make())
    _one_line(e, "True", "boolean", f"vocabulary of {VOCAB}")


@pytest.mark.parametrize("make", [lambda: np.array([2.0, 3.0]), lambda: mx.array([2.0, 3.0]), lambda: [2, 3.0],
                                  lambda: [2, np.float32(3)], lambda: mx.array([2, 3], dtype=mx.bfloat16)])
def test_floats_are_not_token_ids(model, make):
    with pytest.raises(TypeError) as e:
        workbench.trace(model, make())
    _one_line(e, "not an integer", f"vocabulary of {VOCAB}")


def test_numpy_integers_are_token_ids(demo, model):
    want = _logits(demo, [2, 5, 7])
    for ids in ([np.int64(2), np.uint8(5), np.int16(7)], np.array([2, 5, 7], dtype=np.uint16),
                mx.array([2, 5, 7], dtype=mx.int64)):
        got = _logits(model, ids)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_unknown_keywords_are_a_type_error_naming_them(model):
    with pytest.raises(TypeError) as e:
        workbench.trace(model, [2, 3], logit="last")
    _one_line(e, "'logit'")
    with pytest.raises(TypeError) as e:
        model.trace([2, 3], logit="last", caputre="full")
    _one_line(e, "'logit'", "'caputre'")
    with pytest.raises(TypeError) as e:
        workbench.generate(model, [2, 3], max_tokens=1, logit="last")
    _one_line(e, "'logit'")
    with pytest.raises(TypeError) as e:
        C.ablate(model, [2, 3], [C.head(0, 0)], metrc=None)
    _one_line(e, "'metrc'")


def test_images_on_an_op_program_still_say_module_level(demo):
    with pytest.raises(TraceError) as e:
        workbench.trace(demo, [2, 3], images=["x.png"])
    _one_line(e, "module-level")


def test_generate_checks_stop_and_pad_ids(model):
    for stop, kind in (([True], TypeError), ([1.0], TypeError), ([VOCAB], ValueError), (-1, ValueError)):
        with pytest.raises(kind) as e:
            workbench.generate(model, [2, 3], max_tokens=1, stop=stop)
        _one_line(e, "stop token id")
    with pytest.raises(ValueError) as e:
        workbench.generate(model, [[2, 3, 4], [2, 3]], max_tokens=1, pad_id=VOCAB)
    _one_line(e, "pad_id", str(VOCAB), f"vocabulary of {VOCAB}")
    g = workbench.generate(model, [2, 3], max_tokens=2, stop=np.int64(0))  # a numpy id, alone, is a stop id
    assert len(g.tokens) in (1, 2)


def test_token_texts_in_the_causal_tools(demo):
    ids = demo.encode("apple river stone cloud tree | stone")
    blue, red = (demo.tokenizer.encode(s, add_special_tokens=False).ids for s in (" blue", " red"))
    assert len(blue) == len(red) == 1
    by_text = C.ablate(demo, ids, [C.head(0, 0)], metric=C.logit_diff(" blue", " red"))
    by_id = C.ablate(demo, ids, [C.head(0, 0)], metric=C.logit_diff(blue[0], red[0]))
    np.testing.assert_allclose(by_text.values, by_id.values)
    assert by_text.baseline == by_id.baseline and "' blue'" in by_text.metric
    d = C.direct_logit_attribution(demo, ids, answer=" blue", wrong=" red")
    assert (d.answer, d.wrong) == (blue[0], red[0])
    for bad, words in (("apple river", "is 2 tokens, not one: ' apple' ("), ("", "encodes to no token")):
        with pytest.raises(ValueError) as e:
            C.ablate(demo, ids, [C.head(0, 0)], metric=C.logit_diff(bad))
        _one_line(e, repr(bad), words)
    with pytest.raises(TypeError) as e:  # a text metric applied to logits alone: no tokenizer to encode it
        C.logit_diff(" blue")(mx.zeros((1, 3, VOCAB)))
    _one_line(e, "' blue'", "text")


def test_metrics_refuse_booleans_and_floats_when_built():
    for bad in (True, np.bool_(False), 1.5, np.float64(2.0), None, [1, True]):
        with pytest.raises(TypeError) as e:
            C.logit_diff(bad)
        _one_line(e, "answer token id")
    with pytest.raises(TypeError):
        C.token_prob(False)
    with pytest.raises(TypeError):
        C.next_token_prob([2, 3, True], [0])
    with pytest.raises(TypeError):
        C.logit_diff(3, position=True)


def test_metric_position_is_checked(demo):
    with pytest.raises(ValueError) as e:
        C.logit_diff(3, position=5)(mx.zeros((1, 3, VOCAB)))
    _one_line(e, "position 5", "3 positions")


def test_per_sequence_ids_in_range_give_the_logits(demo):
    ids = [demo.encode("apple river stone"), demo.encode("cloud tree stone")]
    lg = _logits(demo, ids)
    m = C.logit_diff(np.array([3, 7]), [5, 11])
    got = m(mx.array(lg))
    np.testing.assert_allclose(got, [lg[0, -1, 3] - lg[0, -1, 5], lg[1, -1, 7] - lg[1, -1, 11]], rtol=1e-6)
    with pytest.raises(ValueError) as e:
        C.logit_diff([3, 4, 5])(mx.array(lg))
    _one_line(e, "3 token ids for a batch of 2")


# --------------------------------------------------------------------------- properties over ids (in a subprocess)

def _ids():
    return st.one_of(
        st.integers(-2 * VOCAB, 2 * VOCAB), st.integers(-2**80, 2**80), st.sampled_from([0, VOCAB - 1, VOCAB, -1]),
        st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
        st.integers(0, 127).map(np.int8), st.integers(-2**15, 2**15 - 1).map(np.int16),
        st.integers(0, 2**64 - 1).map(np.uint64), st.integers(-2**63, 2**63 - 1).map(np.int64),
        st.booleans().map(np.bool_), st.floats(width=32).map(np.float32), st.integers(0, 600).map(float))


def _valid(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and 0 <= int(x) < VOCAB


def _refused(excinfo_value, x, vocab_named: bool = True):
    assert isinstance(excinfo_value, (ValueError, TypeError)), repr(excinfo_value)
    msg = str(excinfo_value)
    assert "\n" not in msg, msg
    shown = str(int(x)) if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) else None
    if shown is not None and len(shown) <= 40:
        assert shown in msg, (x, msg)
    elif shown is None:
        assert repr(x) in msg or str(x) in msg or (isinstance(x, float) and math.isnan(x) and "nan" in msg), (x, msg)
    if vocab_named:
        assert f"vocabulary of {VOCAB}" in msg or f"[0, {VOCAB})" in msg, msg


def property_trace():
    """trace(model, [2, x]) at both granularities: the logits of [2, int(x)], or refused."""
    models = {"op": workbench.load(paths.DEMO), "module": workbench.load(paths.DEMO, granularity="module")}
    want = {i: _logits(models["op"], [2, i])
            for i in (0, VOCAB - 1)}

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(x=_ids(), gran=st.sampled_from(["op", "module"]))
    def prop(x, gran):
        try:
            logits = _logits(models[gran], [2, x])
        except (ValueError, TypeError) as e:
            assert not _valid(x), (x, e)
            _refused(e, x)
            return
        assert _valid(x), f"{x!r} ran as a token id"
        i = int(x)
        if i not in want:
            want[i] = _logits(models["op"], [2, i])
        np.testing.assert_allclose(logits, want[i], rtol=1e-4, atol=1e-4)
    prop()


def property_logit_diff():
    """ablate(..., metric=logit_diff(x)): its baseline is logits[-1, x] of the prompt, or refused."""
    m = workbench.load(paths.DEMO)
    ids = m.encode("apple river stone cloud tree | stone")
    lg = _logits(m, ids)[0, -1]

    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(x=st.one_of(_ids(), st.sampled_from([" blue", "apple river", ""])))
    def prop(x):
        try:
            r = C.ablate(m, ids, [C.head(0, 0)], metric=C.logit_diff(x))
        except (ValueError, TypeError) as e:
            if isinstance(x, str):
                assert x != " blue" and repr(x) in str(e) and "\n" not in str(e), (x, e)
                return
            assert not _valid(x), (x, e)
            # a type is refused when the metric is built (the model not yet known), a range when it is bound
            _refused(e, x, vocab_named=isinstance(e, ValueError))
            return
        i = m.tokenizer.encode(x, add_special_tokens=False).ids[0] if isinstance(x, str) else int(x)
        assert isinstance(x, str) or _valid(x), f"{x!r} ran as a token id"
        np.testing.assert_allclose(r.baseline, lg[i], rtol=1e-5, atol=1e-5)
    prop()


@pytest.mark.parametrize("prop", ["property_trace", "property_logit_diff"])
def test_property_over_ids(prop):
    code = f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_trust_ids
        test_trust_ids.{prop}()
        print("OK")
    """
    r = _subprocess(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), \
        f"rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
