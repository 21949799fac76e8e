"""WeightBrowser without a browser, on inspection reports of zoo checkpoints."""
import pytest

import workbench
from workbench import zoo
from workbench.widgets import WeightBrowser


def _text(out):
    return "".join(o.get("text", "") or o.get("data", {}).get("text/html", "") for o in out.outputs)


def _images(out):
    return [o for o in out.outputs if "image/png" in o.get("data", {})]


@pytest.fixture(scope="module")
def misnamed(tmp_path_factory):
    return workbench.inspect(zoo.build("gemma4_text", tmp_path_factory.mktemp("z") / "m", broken="misnamed"),
                             values=True)


def test_misnamed_layer_is_marked_missing_and_unexpected(misnamed):
    w = WeightBrowser(misnamed)
    assert not misnamed.ok and "2 error(s)" in w.summary.value
    # the browser opens on the first problem: the missing tensor, with the inspector's suggestion
    assert w.tensor.value == "model.layers.1.mlp.down_proj.weight"
    t = _text(w.detail)
    assert "expected by the config, not in the checkpoint" in t
    assert "suggestion: model.layers.1.mlp.down_prj.weight" in t
    labels = dict((v, k) for k, v in w.tensor.options)
    assert labels["model.layers.1.mlp.down_proj.weight"].startswith("✗")
    assert labels["model.layers.1.mlp.down_prj.weight"].startswith("!")
    assert labels["model.layers.1.input_layernorm.weight"].startswith("  ")
    assert dict((v, k) for k, v in w.layer.options)[1].startswith("!")
    # the misnamed tensor itself: present, with stats and a histogram
    w.select("model.layers.1.mlp.down_prj.weight")
    t = _text(w.detail)
    assert "BF16 [64, 128]" in t and "unexpected-tensor" in t
    assert len(_images(w.detail)) == 1
    st = next(x for x in misnamed.to_dict()["tensors"] if x["name"] == "model.layers.1.mlp.down_prj.weight")["stats"]
    assert f"{st['std']:.4g}" in t
    # the per-layer grid marks both cells in layer 1
    assert "✗</td>" in w.grid.value and "!</td>" in w.grid.value
    w.stat.value = "absmax"
    assert "absmax per layer and tensor" in w.grid.value


def test_clean_quantized_checkpoint(tmp_path):
    r = workbench.inspect(zoo.build("gemma4_text", tmp_path / "q", quant="affine4"), values=True)
    w = WeightBrowser(r)
    assert "OK" in w.summary.value and "bits=4" in w.summary.value
    assert "no problems" in w.problems_html.value
    w.select("model.layers.0.mlp.up_proj.weight")
    assert "U32" in _text(w.detail)
    assert len(_images(w.detail)) == 1  # dequantized for the histogram
    with pytest.raises(KeyError):
        w.select("no.such.tensor")


def test_an_error_while_showing_a_tensor_is_shown_in_the_widget(misnamed, monkeypatch):
    import workbench.plots

    w = WeightBrowser(misnamed)
    assert "wb-error-none" in w.actions.area.value

    def broken(*a, **k):
        raise RuntimeError("histogram exploded")

    monkeypatch.setattr(workbench.plots, "weight_histogram", broken)
    w.select("model.layers.1.mlp.down_prj.weight")  # picking a tensor: the histogram fails
    err = w.actions.area.value
    assert "failed</b>" in err and "RuntimeError: histogram exploded" in err and "wb-error-shown" in err
    assert "BF16 [64, 128]" in _text(w.detail)  # what was drawn before the failure stays
    monkeypatch.undo()
    w.stat.value = "absmax"  # the next action that works clears it
    assert w.actions.error is None and "wb-error-none" in w.actions.area.value
