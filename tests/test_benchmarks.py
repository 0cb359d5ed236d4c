"""benchmarks/run.py's plot step (``--plot``), run as a user runs it: a subprocess on a results JSON."""

import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def _row(model, fused_ms, unfused_ms, litert_ms):
    return {"model": model, "batch": 1, "ops": 10, "dispatches": 5, "tflfuse_ms": fused_ms,
            "unfused_ms": unfused_ms, "litert_gpu_ms": litert_ms}


def test_plot_writes_a_png(tmp_path):
    rows = [_row("a_fused", 0.4, 0.7, 0.8), _row("b_fused", 0.5, 0.9, 1.1),
            {"model": "a_unfused", "batch": 1, "ops": 12, "dispatches": 9, "tflfuse_ms": 0.7}]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    png = tmp_path / "plot.png"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), f"--plot={tmp_path / 'r.json'}",
                    f"--png={png}"], check=True, capture_output=True, timeout=300)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_plot_refuses_results_without_fused_rows(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps([{"model": "a_unfused", "batch": 1, "tflfuse_ms": 0.7}]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), f"--plot={tmp_path / 'r.json'}",
                           f"--png={tmp_path / 'p.png'}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "no fused rows" in proc.stderr
    assert not (tmp_path / "p.png").exists()
