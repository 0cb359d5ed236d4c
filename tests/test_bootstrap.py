"""``bootstrap.sh``, the README's two set-up commands: its choice of Python and its quiet install.

The script itself installs system packages and a whole virtual environment, so these tests run its own
lines (read from the file, not copied) on small stand-ins: the Python choice on a PATH of stand-in
interpreters, the project's install line on a new venv with ``--no-deps``.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = (REPO / "bootstrap.sh").read_text()


def _choose(tmp_path, interpreters: dict[str, tuple]) -> subprocess.CompletedProcess:
    """Runs bootstrap.sh's Python choice with only ``interpreters`` on PATH (name -> the version that
    stand-in reports as ``sys.version_info``); it prints the chosen command."""
    block = re.search(r'^py="".*?^if \[ -z "\$py" \].*?$', SCRIPT, re.S | re.M).group(0)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, version in interpreters.items():   # runs the script's test with sys.version_info = version
        stub = bin_dir / name
        stub.write_text(f"#!{sys.executable}\nimport sys\ncode = sys.argv[sys.argv.index('-c') + 1]\n"
                        f"sys.version_info = {tuple(version)!r}\nexec(code)\n")
        stub.chmod(0o755)
    return subprocess.run(["/bin/bash", "-c", f"set -u\n{block}\necho \"chose $py\""], capture_output=True, text=True,
                          env={"PATH": str(bin_dir)}, timeout=60)   # the block uses only bash builtins


@pytest.mark.parametrize("interpreters, chosen", [
    ({"python3": (3, 11, 7)}, "python3"),
    ({"python3": (3, 10, 13), "python3.12": (3, 12, 1)}, "python3.12"),
    ({"python3": (3, 14, 0), "python3.13": (3, 13, 0)}, "python3.13"),
    ({"python3.11": (3, 11, 0), "python3.13": (3, 13, 0)}, "python3.11"),
])
def test_takes_python_3_11_to_3_13(tmp_path, interpreters, chosen):
    r = _choose(tmp_path, interpreters)
    assert r.returncode == 0 and r.stdout.strip() == f"chose {chosen}", r.stdout + r.stderr


def test_refuses_other_pythons_naming_the_supported_ones(tmp_path):
    r = _choose(tmp_path, {"python3": (3, 10, 13), "python": (3, 14, 0)})
    assert r.returncode == 1 and "3.11, 3.12 or 3.13" in r.stderr, r.stdout + r.stderr


def test_the_project_installs_without_setuptools_banner(tmp_path):
    # The script's own install line, on a new venv, without dependencies (they are the suite's venv's).
    line = next(l for l in SCRIPT.splitlines() if re.search(r"pip install .*-e ", l) and not l.startswith("#"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    command = line.replace(".venv/bin/python", str(venv / "bin" / "python")).replace('".[test]"', f'"{REPO}"')
    r = subprocess.run(["bash", "-c", f"{command} --no-deps"], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"})
    assert r.returncode == 0, r.stderr[-3000:]
    banner = [l for l in (r.stdout + r.stderr).splitlines() if "Editable" in l or "*****" in l or "!!" in l]
    assert banner == [], "\n".join(banner)
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util; print(importlib.util.find_spec('tflfuse').origin)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert check.stdout.strip() == str(REPO / "tflfuse" / "__init__.py"), check.stdout + check.stderr
