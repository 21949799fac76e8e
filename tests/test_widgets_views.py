"""HazardTimeline and DiffView without a browser: build them on real analyzer / diff output,
pick things, and read what their Output widgets and HTML hold."""
import json

import numpy as np
import pytest

import workbench  # noqa: F401
from workbench.buffers import analyze, parse
from workbench.diff import compare_arrays
from workbench.widgets import DiffView, HazardTimeline


def _text(out) -> str:
    """All text an Output widget holds (streams and text/html, text/plain display data)."""
    parts = []
    for o in out.outputs:
        if o["output_type"] == "stream":
            parts.append(o["text"])
        else:
            d = o.get("data", {})
            parts.append(d.get("text/html") or d.get("text/plain", ""))
    return "".join(parts)


def _schedule(alias: bool):
    d = lambda name, r, w, wv, rv=None: {  # noqa: E731
        "type": "dispatch", "name": name, "kernel": name.split(".")[-1], "cb": 0,
        "reads": [{"arg": "x", "buffer": r, "offset": 0, "size": 256, **({"value": rv} if rv else {})}],
        "writes": [{"arg": "out", "buffer": w, "offset": 0, "size": 256, "value": wv}]}
    attn_out = "act" if alias else "attnH"
    return parse(json.dumps({
        "format": "workbench.schedule/1", "mode": "serial",
        "buffers": {"x": {"size": 256, "initialized": True}, "act": {"size": 256}, "attnH": {"size": 256}},
        "events": [d("layers.0.self_attn.q_proj", "x", "act", "q"),
                   d("layers.0.self_attn.sdpa", "act", attn_out, "attn", "q"),
                   d("layers.0.self_attn.o_proj", attn_out, "x", "o", "attn"),
                   {"type": "commit", "cb": 0}]}))


def test_hazard_timeline_links_hazard_to_dispatch():
    sch = _schedule(alias=True)
    hz = analyze(sch)
    assert hz and hz[0].event == 1
    w = HazardTimeline(sch)
    assert [h.kind for h in w.hazards] == [h.kind for h in hz]
    assert w.selected is w.hazards[0]
    txt = _text(w.detail)
    assert f"[{hz[0].kind}]" in txt and "layers.0.self_attn.sdpa" in txt
    assert "this dispatch" in txt
    svg = w.chart.value
    assert svg.startswith("<svg") and "stroke=\"#d00\"" in svg  # hazard box drawn
    assert ">act<" in svg and ">attnH<" in svg
    assert "hazards: <b style='color:#c00'>" in w.summary.value
    # zooming away and re-picking brings the hazard back into the window
    w.window.value = (3, 3)
    w.select(0)
    lo, hi = w.window.value
    assert lo <= hz[0].event <= hi


def test_hazard_timeline_clean_schedule():
    w = HazardTimeline(_schedule(alias=False))
    assert w.hazards == []
    assert w.selected is None
    assert "none" in w.summary.value
    assert 'stroke="#d00" stroke-width="2"><title>' not in w.chart.value
    assert w.detail.outputs == ()


def _diff_report(perturb: str | None):
    rng = np.random.default_rng(0)
    order = ["embed_tokens"] + [f"layers.{i}.{p}" for i in range(3) for p in ("attn", "mlp")] + ["logits"]
    ref = {n: rng.standard_normal((4, 16)).astype(np.float32) for n in order}
    eng = {n.replace("layers.", "blk_"): v.copy() for n, v in ref.items()}
    if perturb:
        eng[perturb.replace("layers.", "blk_")] += 1.0
    inputs = {b: (a,) for a, b in zip(order, order[1:])}
    return compare_arrays(ref, eng, order=order, rules=[["^blk_", "layers."]], inputs=inputs)


def test_diff_view_marks_first_divergence():
    rep = _diff_report("layers.1.mlp")
    assert rep.first_divergence.op == "layers.1.mlp"
    v = DiffView(rep)
    assert "first divergence: layers.1.mlp" in v.summary.value
    assert v.op.value == "layers.1.mlp"
    assert "layers.1.mlp (engine 'blk_1.mlp'): diverged" in _text(v.detail)
    assert "layers.1.attn (ok)" in _text(v.detail)  # its input was still fine
    png = [o for o in v.plot.outputs if "image/png" in o.get("data", {})]
    assert len(png) == 1
    v.show("layers.0.attn")
    assert _text(v.detail).startswith("layers.0.attn (engine 'blk_0.attn'): ok")
    v.first.click()
    assert v.op.value == "layers.1.mlp"
    v.metrics.value = ()
    assert "pick at least one metric" in _text(v.plot)
    v.metrics.value = ("max_abs",)
    assert len([o for o in v.plot.outputs if "image/png" in o.get("data", {})]) == 1


def test_diff_view_no_divergence():
    v = DiffView(_diff_report(None))
    assert "no divergence" in v.summary.value
    assert v.first.disabled


def test_hazard_timeline_on_the_emulated_attnH_story(tmp_path):
    import workbench
    from workbench import zoo
    from workbench.buffers import Emulator

    model = workbench.load(zoo.build("gemma4_text", tmp_path / "g4", dtype="float32"))
    emu = Emulator(model, [1, 5, 9, 3, 7, 2])
    o_proj, ctx = "layers.1.self_attn.o_proj", "layers.1.self_attn.context"
    bad = emu.run(emu.plan().place(o_proj, like=ctx))
    w = HazardTimeline(bad.schedule)
    h = w.selected
    assert (h.kind, h.event) == ("alias-in-dispatch", bad.dispatch_of(o_proj))
    lo, hi = w.window.value
    assert lo <= h.event <= hi
    txt = _text(w.detail)
    assert f"dispatch {h.event} '{o_proj}'" in txt and f"Give {o_proj} its own output buffer" in txt
    assert f">{h.buffer}<" in w.chart.value
    fixed = HazardTimeline(emu.run(emu.plan().place(o_proj, like=ctx).place(o_proj, buffer="attnH")).schedule)
    assert fixed.hazards == [] and ">attnH<" in fixed.chart.value


def test_errors_in_callbacks_are_shown_in_the_widget(monkeypatch):
    import workbench.plots

    w = HazardTimeline(_schedule(alias=True))
    monkeypatch.setattr(HazardTimeline, "svg", lambda self: 1 / 0)
    w.window.value = (0, 1)
    assert "move the event window failed" in w.actions.area.value and "ZeroDivisionError" in w.actions.area.value
    monkeypatch.undo()
    w.window.value = (0, 2)
    assert w.actions.error is None and w.chart.value.startswith("<svg")

    v = DiffView(_diff_report("layers.1.mlp"))
    monkeypatch.setattr(workbench.plots, "error_curve", lambda *a, **k: (_ for _ in ()).throw(ValueError("no curve")))
    v.metrics.value = ("max_abs",)
    assert "pick metrics failed" in v.actions.area.value and "ValueError: no curve" in v.actions.area.value
    v.show("layers.0.attn")  # picking an op still works, and clears the error
    assert v.actions.error is None and _text(v.detail).startswith("layers.0.attn")


def test_diff_view_callbacks_from_another_thread_run_on_its_thread():
    """As ipykernel does for JupyterLab's subshells: the pick arrives on another thread and
    is handed to the thread (event loop) that built the view."""
    import asyncio
    import threading

    seen = []

    async def main():
        v = DiffView(_diff_report("layers.1.mlp"))
        real = v._detail
        v._detail = lambda: (seen.append(threading.current_thread().name), real())[1]
        t = threading.Thread(target=lambda: setattr(v.op, "value", "layers.0.attn"), name="subshell-test")
        t.start()
        t.join()
        for _ in range(500):
            if v.actions.count:
                break
            await asyncio.sleep(0.01)
        return v

    v = asyncio.run(main())
    assert seen == ["MainThread"] and v.actions.count == 1 and v.actions.error is None
    assert _text(v.detail).startswith("layers.0.attn (engine 'blk_0.attn'): ok")
