"""What a widget view saved in a notebook shows before its cell runs.

A notebook saved with its widget state (``notebook build`` does it) lets JupyterLab draw
every view with no kernel behind it: the picture of the last run, but its buttons would
look clickable and do nothing.  :func:`mark_unrun` edits that saved state: in every view
holding an error area (``wb-error``: each widget with buttons has one,
:class:`workbench.widgets._actions.Actions`), the controls are disabled and the area says
:data:`UNRUN`.  The kernel-side widget never carries the note: a cell that runs makes a
new, live view.  A page without the widget manager shows the text form, which says the
same (each widget's ``__repr__``).
"""
from __future__ import annotations

import re

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
UNRUN = "run the cell to use the buttons"
#: the saved value of an error area: the note, in the wb-unrun class (tests and styles find it)
UNRUN_HTML = (f"<div class='wb-unrun' style='color:#555;background:#f4f4f4;border:1px dashed #aaa;"
              f"padding:3px 6px;margin:4px 0'>saved view: {UNRUN}</div>")
#: the ipywidgets controls a view may hold (their ``disabled`` may be left out of a saved state as a default)
CONTROLS = frozenset({"ButtonModel", "ToggleButtonModel", "ToggleButtonsModel", "CheckboxModel", "ComboboxModel",
                      "TextModel", "DropdownModel", "SelectModel", "SelectMultipleModel", "RadioButtonsModel",
                      "IntSliderModel", "FloatSliderModel", "IntRangeSliderModel", "FloatRangeSliderModel",
                      "SelectionSliderModel", "SelectionRangeSliderModel", "IntTextModel", "FloatTextModel"})
_REF = re.compile(r"IPY_MODEL_([0-9a-f]{32})")


def _refs(value) -> list[str]:
    if isinstance(value, str):
        return _REF.findall(value)
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _refs(v)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _refs(v)]
    return []


def _below(state: dict, top: str) -> list[str]:
    """The model ids of ``top`` and every model it references (children, layouts, ...)."""
    seen, todo = [], [top]
    while todo:
        mid = todo.pop()
        if mid in seen or mid not in state:
            continue
        seen.append(mid)
        todo += _refs(state[mid].get("state", {}))
    return seen


def mark_unrun(nb) -> int:
    """Disable the controls of every saved view with an error area and put :data:`UNRUN` in
    that area; returns how many views were marked.  ``nb``: a notebook (nbformat node or
    dict) with saved widget state; one without is left alone."""
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    tops = [o["data"][WIDGET_VIEW]["model_id"] for c in nb.get("cells", []) for o in c.get("outputs", [])
            if WIDGET_VIEW in o.get("data", {})]
    marked = 0
    for top in tops:
        ids = _below(state, top)
        areas = [m for m in ids if "wb-error" in state[m].get("state", {}).get("_dom_classes", [])]
        if not areas:
            continue
        for m in ids:
            st = state[m].setdefault("state", {})
            if "disabled" in st or state[m].get("model_name") in CONTROLS:
                st["disabled"] = True
        for m in areas:
            state[m]["state"]["value"] = UNRUN_HTML
        marked += 1
    return marked


def text_form(widget) -> str:
    """A widget's ``repr``: what a page without the widget manager (an untrusted notebook, a
    plain viewer) shows in place of the view."""
    return f"{type(widget).__name__}: {UNRUN} (an interactive view; this is its text form)"
