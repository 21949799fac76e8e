"""workbench.generate: greedy and sampled decoding through the KV cache, token for token
equal to mlx-lm's ``generate_step`` (same seed, same settings), statistics of every op of
every forward, and the sampling arguments checked."""
import pytest

import workbench
import mlx.core as mx
import numpy as np

from workbench import zoo
from workbench.trace.generate import Sampler, check_sampling
from workbench.zoo import reference as zoo_ref
from workbench.trace import Run

PROMPT = [2, 15, 16, 17, 18, 19]
N = 12


@pytest.fixture(scope="module")
def g4_path(tmp_path_factory):
    return zoo.build("gemma4_text", tmp_path_factory.mktemp("g4"), dtype="float32")


@pytest.fixture(scope="module")
def g4(g4_path):
    return workbench.load(g4_path)


@pytest.fixture(scope="module")
def phi3_path(tmp_path_factory):
    return zoo_ref.build("phi3", tmp_path_factory.mktemp("p3") / "phi3")


@pytest.fixture(scope="module")
def phi3(phi3_path):
    m = workbench.load(phi3_path)
    assert m.granularity == "module"  # no op program: mlx-lm's own modules and cache
    return m


def mlx_lm_tokens(path, prompt, n, temperature=0.0, top_p=1.0, top_k=0, seed=None):
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load_model

    ref, _ = load_model(path)
    if seed is not None:
        mx.random.seed(seed)
    sampler = make_sampler(temperature, top_p=top_p, top_k=top_k)
    return [t for t, _ in generate_step(mx.array(prompt), ref, max_tokens=n, sampler=sampler)]


SETTINGS = [dict(), dict(temperature=0.8, top_p=0.9, top_k=40)]


@pytest.mark.parametrize("settings", SETTINGS, ids=["greedy", "sampled"])
@pytest.mark.parametrize("which", ["op", "module"])
def test_tokens_equal_mlx_lm_generate_step(which, settings, request, g4_path, phi3_path):
    model, path = (request.getfixturevalue("g4"), g4_path) if which == "op" else \
        (request.getfixturevalue("phi3"), phi3_path)
    for seed in (0, 5):
        # generate_step does not stop at <eos>: neither do we here
        g = workbench.generate(model, PROMPT, max_tokens=N, capture="stats", seed=seed, past_eos=True, **settings)
        assert g.tokens == mlx_lm_tokens(path, PROMPT, N, seed=seed, **settings), (which, seed)
        assert g.sampling["seed"] == seed


def test_sampling_is_reproducible_and_leaves_the_global_generator_alone(g4):
    kw = dict(max_tokens=N, capture=None, temperature=1.0)
    mx.random.seed(123)
    before = np.array(mx.random.state[0])
    a = workbench.generate(g4, PROMPT, seed=1, **kw).tokens
    assert np.array_equal(np.array(mx.random.state[0]), before)
    assert workbench.generate(g4, PROMPT, seed=1, **kw).tokens == a
    others = {tuple(workbench.generate(g4, PROMPT, seed=s, **kw).tokens) for s in (2, 3, 4)}
    assert tuple(a) not in others and len(others) > 1  # sampled, not greedy in disguise
    assert a != workbench.generate(g4, PROMPT, max_tokens=N, capture=None).tokens
    # seed=None draws from MLX's global generator, as mlx-lm does
    mx.random.seed(1)
    assert workbench.generate(g4, PROMPT, **kw).tokens == a
    assert not np.array_equal(np.array(mx.random.state[0]), np.array(mx.random.key(1)))


def test_greedy_unchanged_and_sampling_limits(g4):
    greedy = workbench.generate(g4, PROMPT, max_tokens=N, capture="stats")
    # greedy = argmax of each forward's last logits, fed back through the cache
    assert greedy.tokens == [int(mx.argmax(t.logits[0, -1]).item()) for t in greedy.traces]
    assert greedy.sampling == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None}
    # top_k=1 leaves one token: sampling at any temperature is the argmax
    assert workbench.generate(g4, PROMPT, max_tokens=N, temperature=2.0, top_k=1, seed=9).tokens == greedy.tokens
    # a tiny top_p keeps only the most likely token too
    assert workbench.generate(g4, PROMPT, max_tokens=N, temperature=2.0, top_p=1e-6, seed=9).tokens == greedy.tokens


def test_sampled_tokens_follow_the_distribution():
    """The sampler on fixed logits: frequencies match softmax(logits / T) over the kept tokens."""
    logits = mx.array([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    draws = 4000

    def freqs(**kw):
        s = Sampler(seed=11, **kw)
        out = np.array([s(logits).item() for _ in range(draws)])
        return np.bincount(out, minlength=6) / draws

    def expect(T, keep):
        z = np.array(logits[0]) / T
        p = np.where(np.arange(6) < keep, np.exp(z - z.max()), 0.0)
        return p / p.sum()

    f = freqs(temperature=0.7)
    assert np.abs(f - expect(0.7, 6)).max() < 0.03
    assert np.abs(freqs(temperature=1.0, top_k=2) - expect(1.0, 2)).max() < 0.03
    # top_p 0.8: the smallest head of the distribution holding >= 80% of the mass (3 tokens here)
    p1 = expect(1.0, 6)
    assert p1[:2].sum() < 0.8 <= p1[:3].sum()
    assert np.abs(freqs(temperature=1.0, top_p=0.8) - expect(1.0, 3)).max() < 0.03
    assert np.array_equal(freqs(temperature=0.7), f)  # same seed, same draws


def test_statistics_of_every_op_of_every_forward(g4, phi3):
    for model in (g4, phi3):
        g = workbench.generate(model, PROMPT, max_tokens=5, capture="stats", temperature=0.9, seed=2)
        assert len(g.tokens) == 5 and len(g.traces) == 5
        for k, t in enumerate(g.traces):
            steps = t.steps
            assert t.done and len(steps) == len(t.ops)
            assert all(s.stats is not None and s.stats["nan"] == 0 for s in steps), k
            assert t.ids.shape == ((1, len(PROMPT)) if k == 0 else (1, 1))
        st = g.stats("logits")
        assert len(st) == 5 and all(np.isfinite(s["absmax"]) for s in st)
        assert g.first_nonfinite() is None
        # the token k+1's forward ran on token k
        assert [int(t.ids[0, 0].item()) for t in g.traces[1:]] == g.tokens[:-1]


def test_batch_and_stop(g4):
    gb = workbench.generate(g4, [PROMPT, PROMPT[:4]], max_tokens=4, temperature=1.0, seed=3)
    assert len(gb.tokens) == 2 and all(len(t) == 4 for t in gb.tokens)
    assert gb.tokens == workbench.generate(g4, [PROMPT, PROMPT[:4]], max_tokens=4, temperature=1.0, seed=3).tokens
    g = workbench.generate(g4, PROMPT, max_tokens=N)
    s = workbench.generate(g4, PROMPT, max_tokens=N, stop=[g.tokens[2]])
    assert s.tokens == g.tokens[:g.tokens.index(g.tokens[2]) + 1]
    # the forward queued on the stop token (built before the token was read) is dropped: its
    # captured values leave the shared store, and the cache holds the prompt and the tokens fed
    assert len(s.traces) == len(s.tokens) and all(t.steps[-1].stats is not None for t in s.traces)
    f = workbench.generate(g4, PROMPT, max_tokens=N, stop=[g.tokens[2]], capture="full")
    k = len(f.tokens)
    store = f.traces[0].store
    assert f.tokens == s.tokens and len(store) == k * len(g4.program.ops)
    assert f"{k}/logits" not in store and f"{k - 1}/logits" in store
    assert f.traces[-1].ctx.cache.offset == len(PROMPT) + k - 1


def test_queued_decoding_equals_one_forward_at_a_time(g4):
    # generate() queues forward k+1 on the sampled token before reading token k back; the
    # same forwards run one after another, each waited for, give the same statistics
    g = workbench.generate(g4, PROMPT, max_tokens=4, capture="stats", temperature=0.9, seed=5)
    cache = g4.make_cache()
    ids = [PROMPT] + [[t] for t in g.tokens[:-1]]
    for k, (chunk, t) in enumerate(zip(ids, g.traces)):
        r = workbench.trace(g4, chunk, capture="stats", run=Run(cache=cache))
        r.run()
        assert [s.stats for s in r.steps] == [s.stats for s in t.steps], k


def test_feeds_check_the_ids_unless_told_they_come_from_the_sampler(g4):
    bad = mx.array([[1, g4.vocab_size]], mx.int32)
    with pytest.raises(ValueError, match=f"token id {g4.vocab_size} out of range"):
        g4.feeds(bad)
    assert g4.feeds(bad, check_ids=False)["input_ids"].shape == (1, 2)  # not read back


@pytest.mark.parametrize("kw, name", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature="0.5"), "temperature"),
    (dict(temperature=True), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(top_p=None), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_k=True), "top_k"),
    (dict(seed=-1), "seed"), (dict(seed=1.5), "seed"), (dict(seed="1"), "seed"),
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=2.0), "max_tokens"),
])
def test_bad_arguments_name_themselves(g4, kw, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        workbench.generate(g4, PROMPT, **kw)


def test_check_sampling_accepts_the_edges():
    assert check_sampling(0, 1, 0, None) == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None}
    assert check_sampling(1e-3, 1e-9, 10**6, 2**64 - 1)["seed"] == 2**64 - 1
    assert check_sampling(np.float32(0.5), np.float64(0.5), np.int64(3), np.int32(4))["top_k"] == 3


def test_the_collector_is_paused_only_while_decoding(g4, monkeypatch):
    import gc
    import importlib

    gen_mod = importlib.import_module("workbench.trace.generate")  # (the package exports the function)

    seen = []
    real = gen_mod._trace

    def spy(*a, **k):  # a forward after the first: inside the decoding loop
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(gen_mod, "_trace", spy)
    assert gc.isenabled()
    workbench.generate(g4, [3, 5, 7], max_tokens=3)
    assert seen[1:] == [False, False] and gc.isenabled()  # paused inside, enabled again after
    gc.disable()
    try:
        workbench.generate(g4, [3, 5, 7], max_tokens=2)
        assert not gc.isenabled()  # a caller's disabled collector stays disabled
    finally:
        gc.enable()

    def boom(*a, **k):
        raise RuntimeError("forward failed")

    seen.clear()
    monkeypatch.setattr(gen_mod, "Sampler", lambda *a, **k: boom)
    with pytest.raises(RuntimeError, match="forward failed"):
        workbench.generate(g4, [3, 5, 7], max_tokens=3)
    assert gc.isenabled()  # restored when decoding fails


def test_a_long_generation_holds_its_cache_once_not_once_per_token(tmp_path):
    """Each forward's trace keeps what going back needs; with a KV cache that is the cache's
    lengths (not a copy of it as it was) and no undo log (going back replays): the memory a
    generation holds grows with its tokens, not with their square."""
    p = zoo.build("llama", tmp_path / "l", dtype="float32", hidden_size=256, num_attention_heads=4,
                  num_key_value_heads=4, head_dim=64, num_hidden_layers=8, intermediate_size=512)
    model = workbench.load(p)
    workbench.generate(model, [1, 2, 3, 4], max_tokens=2)  # weights read and converted
    mx.clear_cache()
    before = mx.get_active_memory()
    n = 300
    g = workbench.generate(model, [1, 2, 3, 4], max_tokens=n)
    held = mx.get_active_memory() - before
    kv = 8 * 2 * 4 * 64 * (n + 4) * 4  # the final keys and values, float32
    assert held < 8 * kv, f"{n} tokens hold {held / 2**20:.1f} MiB; the final KV cache is {kv / 2**20:.1f} MiB"
    # going back over a decoding step still works: it replays from the cache's lengths then
    t = g.traces[5]
    last = t.steps[-1]
    t.back()
    assert t.position == last.index
    t.run()
    np.testing.assert_array_equal(np.array(t.logits), np.array(g.traces[5].logits))


def test_a_trimmed_cache_cannot_be_gone_back_over(g4):
    from workbench.trace.step import TraceError  # noqa: F401  (the trace names the problem)

    cache = g4.make_cache()
    t = g4.trace([3, 5, 7, 9], run=Run(cache=cache))
    t.run()
    t2 = g4.trace([11], run=Run(cache=cache))
    t2.run()
    snap = cache.snapshot()
    cache.keys = [None if k is None else k[:, :, :2] for k in cache.keys]  # cut behind its back
    with pytest.raises(ValueError, match="fewer positions than when this forward began"):
        cache.restore(snap)
    cache.trim(2)
    with pytest.raises(ValueError, match="trimmed after this forward ran"):
        t2.back()


def test_a_long_module_level_generation_holds_its_cache_once(phi3):
    """Module level: mlx-lm's own KVCache is snapshotted as its offset (it only appends), not
    copied for every decoding step's session.  This zoo phi3 (2 layers, 2 KV heads of 16)
    held 47.9 MiB after 300 tokens before (a copy of the 256-step cache buffers per step),
    4.7 MiB after (the traces' own records: about 16 KB a token)."""
    from workbench.reference.model import _appends_only
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    assert _appends_only(KVCache()) and not _appends_only(RotatingKVCache(max_size=8))
    workbench.generate(phi3, [1, 2, 3, 4], max_tokens=2)
    mx.clear_cache()
    before = mx.get_active_memory()
    workbench.generate(phi3, [1, 2, 3, 4], max_tokens=300)
    held = mx.get_active_memory() - before
    assert held < 16 * 2**20, f"300 tokens hold {held / 2**20:.1f} MiB"


def test_generation_stops_at_eos_unless_asked_to_keep_going(g4, monkeypatch):
    from workbench.trace.generate import eos_ids

    assert eos_ids(g4) == (g4.config["eos_token_id"],)  # the zoo's config: one id
    free = workbench.generate(g4, PROMPT, max_tokens=N, past_eos=True)
    assert len(free.tokens) == N and free.stopped == "max_tokens" and free.eos == ()
    k = next(i for i, t in enumerate(free.tokens) if i >= 2 and t not in free.tokens[:i])
    # the config's eos_token_id may be a list (Gemma's is): any of them ends the text
    monkeypatch.setitem(g4.config, "eos_token_id", [g4.vocab_size - 1, free.tokens[k]])
    assert eos_ids(g4) == (g4.vocab_size - 1, free.tokens[k])
    g = workbench.generate(g4, PROMPT, max_tokens=N)
    assert g.tokens == free.tokens[:k + 1] and g.stopped == "eos" and g.eos == eos_ids(g4)
    assert len(g.traces) == k + 1
    kept = workbench.generate(g4, PROMPT, max_tokens=N, past_eos=True)
    assert kept.tokens == free.tokens and kept.stopped == "max_tokens"
    s = workbench.generate(g4, PROMPT, max_tokens=N, stop=[free.tokens[1]])
    assert s.tokens == free.tokens[:2] and s.stopped == "stop"
    monkeypatch.setitem(g4.config, "eos_token_id", "</s>")
    with pytest.raises(ValueError, match="eos_token_id '</s>' is not a token id"):
        workbench.generate(g4, PROMPT, max_tokens=2)
