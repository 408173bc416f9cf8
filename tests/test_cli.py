import json
import subprocess
import sys


def _forkv(*args):
    return subprocess.run([sys.executable, "-m", "forkv.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_demo_runs():
    r = _forkv("demo", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "finish=" in r.stdout and "prefill=" in r.stdout


def test_doctor_reports_blas_and_dtype():
    r = _forkv("doctor", "--json", "--model", "demo:qwen3_5:tiny")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["dtype"].startswith("float32") and "blas" in info
    assert info["cache_layout"] == "2 global, 2 state"


def test_bad_model_is_a_clear_error():
    r = _forkv("generate", "x", "--model", "demo:nope")
    assert r.returncode == 2 and "Unknown demo model" in r.stderr
