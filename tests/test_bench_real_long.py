"""benchmarks/bench_real.py's long rows (issue 28 item 5) on the CPU at tiny shapes: a row
past the logits budget drops the one-call reference for mlx-lm's chunked prefill and compares
the last position's logits; the profile and the crash hunt's cost run.  The H200 figures are
in benchmarks/README.md (stop 26)."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_real  # noqa: E402


@pytest.mark.slow
def test_long_rows_chunked_prefill_profile_and_crash_hunt(tmp_path, monkeypatch, capsys):
    # 16 tokens x 256 vocab in bf16 = 8 KiB of logits: a 6 KB budget makes 16 a long row, 8 (4 KiB) not
    monkeypatch.setenv("WORKBENCH_LOGITS_BUDGET", "6000")
    out = tmp_path / "r.json"
    assert bench_real.main(["e2b", "--layers", "2", "--vocab", "256", "--tokens", "8,16", "--reps", "1",
                            "--steps", "0", "--hunt", "off", "--full", "off", "--prefill-chunk", "4",
                            "--profile", "--crash-hunt", "16", "--path", str(tmp_path / "ck"),
                            "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    short, long = r["rows"]
    assert not short["long"] and long["long"]
    assert set(short["times"]) == {"mlx-lm", "mlx-lm-chunked", "mlx-lm-chunked-all", "trace-none", "trace-stats"}
    assert set(long["times"]) == {"mlx-lm-chunked", "mlx-lm-chunked-all", "trace-none", "trace-stats"}
    assert long["logits_kept"].startswith("position 15") and long["compared_with"] == "mlx-lm-chunked"
    assert short["max_abs_diff_vs_reference"] == 0 and long["max_abs_diff_vs_reference"] == 0
    last = long["last_position"]  # mlx-lm's one-call forward at the last position, its head on that row only
    assert last["one_call_absmax"] > 0 and last["trace_vs_one_call"] == 0
    assert last["trace_one_call_windows_vs_one_call"] == 0 and last["chunked_vs_one_call"] == 0
    assert short["last_position"] == {}
    assert r["profile"]["tokens"] == 16 and r["profile"]["top"]
    assert [c["logits"] for c in r["crash_hunt"]] == ["all", "default"]
    assert all(c["exit_code"] == 0 and c["steps_completed"] == c["steps"] for c in r["crash_hunt"])
    text = capsys.readouterr().out
    assert "mlx-lm-chunked (issue 28: <= 1.25x at 32k)" in text and "hunt --crash, 16 tokens" in text
