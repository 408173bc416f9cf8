"""`forkv doctor` and a bad model name, in process (the module entry point itself is run as a
subprocess by test_cli_errors; the demo's output by test_cli_show)."""

import json

from forkv.cli import main


def test_doctor_reports_blas_and_dtype(capsys):
    assert main(["doctor", "--json", "--model", "demo:qwen3_5:tiny"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["dtype"].startswith("float32") and "blas" in info
    assert sorted(info["cache_layout"].split(", ")) == ["2 global", "2 state"]
    assert "records in RAM up to 64 MiB" in info["memory"]  # the RAM budget forkv keeps
    assert "live caches up to 512 MiB" in info["memory"]
    assert "one RAM budget of 2 GiB (--ram, FORKV_RAM)" in info["memory"]  # over all of them
    assert "demo:qwen3_5:tiny: a request of 32,768 tokens holds ~" in info["memory"]


def test_bad_model_is_a_clear_error(capsys):
    assert main(["generate", "x", "--model", "demo:nope"]) == 2
    err = capsys.readouterr().err
    assert "Unknown demo model" in err and err.count("\n") == 1
