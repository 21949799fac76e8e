"""One interface where the two granularities meet (workbench/traceable.py): the op model, the
streamed model and the reference (module-level) model each satisfy what a trace needs of
them, member by member and call shape by call shape, and a trace through it runs."""
from __future__ import annotations

import inspect

import pytest

import workbench
from workbench import zoo
from workbench.models import Model, StreamedModel
from workbench.reference import ReferenceModel
from workbench.traceable import ModuleTraceable, OpTraceable, Traceable, provided

IDS = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = zoo.build("llama", tmp_path_factory.mktemp("traceable") / "llama", dtype="float32")
    return {"op": workbench.load(path), "streamed": workbench.load(path, memory_budget="1GB"),
            "module": workbench.load(path, granularity="module")}


def _members(proto) -> dict[str, object]:
    """The protocol's members: its annotated attributes (None) and methods / properties."""
    out = {}
    for klass in reversed(proto.__mro__):
        if klass in (object,) or not getattr(klass, "_is_protocol", False):
            continue
        out.update({n: None for n in getattr(klass, "__annotations__", {})})
        out.update({n: v for n, v in vars(klass).items() if not n.startswith("_") and callable(v)
                    or isinstance(v, property)})
    return out


def _call_shape_fits(proto_fn, impl) -> str | None:
    """None when ``impl`` accepts every call the protocol's signature allows (its positional
    parameters by position, its keyword-only ones by name); else what does not fit."""
    want = inspect.signature(proto_fn)
    have = inspect.signature(impl)
    params = list(want.parameters.values())[1:]  # (self)
    pos = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    kw = {p.name: None for p in params if p.kind == p.KEYWORD_ONLY}
    try:
        have.bind(None, *pos, **kw)  # every argument, by position
        have.bind(None, **{n: None for n in pos}, **kw)  # ... and by the protocol's names
        required = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty]
        have.bind(None, *required)  # the defaults are the implementation's too
        for name in (p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is not p.empty):
            have.bind(None, *required, **{name: None})  # each optional one by name
    except TypeError as e:
        return f"{have} does not take the protocol's {want}: {e}"
    return None


CASES = [("op", Model, OpTraceable), ("streamed", StreamedModel, OpTraceable),
         ("module", ReferenceModel, ModuleTraceable)]


@pytest.mark.parametrize("which,cls,proto", CASES)
def test_each_model_satisfies_its_protocol(models, which, cls, proto):
    m = models[which]
    assert type(m) is cls
    assert isinstance(m, Traceable) and isinstance(m, proto)
    assert m.granularity == ("module" if proto is ModuleTraceable else "op")
    missing, misfit = [], []
    for name, member in _members(proto).items():
        try:
            inspect.getattr_static(m, name)
        except AttributeError:
            missing.append(name)
            continue
        if callable(member) and not isinstance(member, property):
            why = _call_shape_fits(member, getattr(type(m), name))
            if why:
                misfit.append(f"{name}: {why}")
    assert not missing and not misfit, (missing, misfit)
    # the members a trace reads, read: the names its steps carry, and the tensors one reads
    names = m.step_names
    assert names and all(isinstance(n, str) for n in names)
    proj = next(n for n in names if n.endswith("q_proj"))
    assert any(k.endswith("q_proj.weight") for k in m.op_tensors(proj))


def test_the_protocol_can_refuse():
    # a model without op_tensors (or one of the other members) is not a Traceable
    class Half:
        granularity = "op"

    assert not isinstance(Half(), Traceable)
    members = _members(OpTraceable)
    assert {"op_tensors", "step_names", "granularity", "trace", "program", "feeds", "context"} <= set(members)
    assert "module_trace" in _members(ModuleTraceable) and "module_trace" not in members

    class Narrow:
        def feeds(self, ids): ...

    assert _call_shape_fits(OpTraceable.feeds, Narrow.feeds) is not None


def test_a_model_reaches_the_tracer_through_what_the_top_package_provides(models):
    # models/ never imports the tracer (tests/test_house.py): model.trace is the provided entry
    from workbench.trace.entry import trace

    assert provided("trace")(models["op"], IDS).__class__ is trace(models["op"], IDS).__class__
    t = models["op"].trace(IDS)
    t.run()
    assert t.done and t.ops[-1] == "logits"
    with pytest.raises(RuntimeError, match="nothing provides 'nothing'"):
        provided("nothing")
