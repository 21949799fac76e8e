"""`workbench lab`: the README's main command opens JupyterLab on notebooks/."""
import json
import os
import subprocess
import sys
import time
import urllib.request

from workbench.cli import main as cli_main
from workbench.lab import NOTEBOOKS, trust_notebooks


def test_dry_run_json_describes_the_launch(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    assert cli_main(["lab", "--dry-run", "--json", "--port", "8899"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["notebook_dir"] == str(NOTEBOOKS)
    assert "01_tour.ipynb" in info["notebooks"] and len(info["notebooks"]) >= 8
    assert info["trusted"] == info["notebooks"]       # the curated notebooks would be trusted...
    assert not (tmp_path / "data").exists()           # ...but a dry run signs nothing
    assert info["url"].startswith("http://127.0.0.1:8899/lab/tree/01_tour.ipynb?token=")
    cmd = info["command"]
    assert cmd[:3] == [sys.executable, "-I", "-c"] and cmd[5] == "jupyterlab"  # isolated (workbench.child)
    assert f"--ServerApp.root_dir={NOTEBOOKS}" in cmd and "--ServerApp.ip=127.0.0.1" in cmd
    assert "--LabApp.default_url=/lab/tree/01_tour.ipynb" in cmd


def test_unusable_input_exits_2(tmp_path, capsys):
    assert cli_main(["lab", str(tmp_path / "nowhere"), "--dry-run"]) == 2
    assert "no notebook directory" in capsys.readouterr().err
    assert cli_main(["lab", "--port", "70000", "--dry-run"]) == 2


def test_lab_serves_the_notebooks(tmp_path):
    """Start `workbench lab` for real, list the notebooks through its REST API, stop it."""
    served = tmp_path / "nb"
    served.mkdir()
    (served / "01_tour.ipynb").write_text((NOTEBOOKS / "01_tour.ipynb").read_text())
    env = {"JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           }
    env = {**os.environ, **env}
    p = subprocess.Popen([sys.executable, "-m", "workbench.cli", "lab", str(served), "--port", "0",
                          "--no-browser", "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, env=env)
    try:
        info = json.loads(p.stdout.readline())
        base, token = info["url"].split("/lab/")[0], info["url"].split("token=")[1]
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=2) as r:
                    listing = json.load(r)
                break
            except OSError:
                assert p.poll() is None, "workbench lab exited"
                assert time.monotonic() < deadline, "JupyterLab did not answer in 90 s"
                time.sleep(0.5)
        assert [c["name"] for c in listing["content"]] == ["01_tour.ipynb"]
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_only_the_curated_notebooks_are_trusted(tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.ipynb").write_text((NOTEBOOKS / "01_tour.ipynb").read_text())
    assert cli_main(["lab", str(other), "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trusted"] == []


def test_trust_notebooks_signs_for_this_user(tmp_path, monkeypatch, capsys):
    """What `workbench lab` does before starting: the notebooks' saved outputs (widget
    views) are then rendered by JupyterLab (tests/test_browser_static.py sees it)."""
    from nbformat import NO_CONVERT, read
    from nbformat.sign import NotebookNotary

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    root = tmp_path / "nb"
    root.mkdir()
    for name in ["01_tour.ipynb", "02_weights.ipynb"]:
        (root / name).write_text((NOTEBOOKS / name).read_text())
    (root / "broken.ipynb").write_text("{not json")
    nb = read(str(root / "01_tour.ipynb"), as_version=NO_CONVERT)
    assert not NotebookNotary().check_signature(nb)
    assert trust_notebooks(root) == ["01_tour.ipynb", "02_weights.ipynb"]
    assert "broken.ipynb: not trusted, not one of the committed notebooks" in capsys.readouterr().err
    assert NotebookNotary().check_signature(nb)
    assert trust_notebooks(root) == []                 # already trusted: nothing written
    (root / "01_tour.ipynb").write_text((NOTEBOOKS / "01_tour.ipynb").read_text().replace("A tour", "A changed tour"))
    assert trust_notebooks(root) == []                 # a changed notebook is not the committed one
    assert "01_tour.ipynb: not trusted, its content differs" in capsys.readouterr().err
