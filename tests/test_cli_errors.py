"""Bad input on the command line is one line naming the file / node / field and the fix, with
exit status 2; Ctrl-C is one line and exit status 130; logging is switched on by -v/FORKV_LOG."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import load_tiny
from forkv.cli import main
from server_proc import default_sigint


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("forkv: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "pydantic.dev" not in err
    return err


@pytest.fixture
def model_copy(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(load_tiny("qwen3").path, folder)
    return folder


@pytest.mark.parametrize("config, message", [
    ("{broken", ("config.json' is not valid JSON (Expecting property name enclosed in double "
                 "quotes at line 1, column 2); fix or replace the file.")),
    ("drop", "config.json' lacks field(s) 'hidden_size', which its model_type needs"),
    ('{"a": 1}', "config.json' has no \"model_type\""),
])
def test_bad_config_json_names_the_file(model_copy, capsys, config, message):
    path = model_copy / "config.json"
    if config == "drop":
        data = json.loads(path.read_text())
        del data["hidden_size"]
        config = json.dumps(data)
    path.write_text(config)
    assert main(["generate", "x", "--model", str(model_copy)]) == 2
    assert message in _one_line(capsys)


def test_bad_sampling_values_are_one_line(capsys):
    assert main(["generate", "x", "--temperature", "-1"]) == 2
    assert "temperature must be a number >= 0" in _one_line(capsys)
    assert main(["generate", "x", "--logit-bias", "7"]) == 2
    assert "--logit-bias takes ID=BIAS" in _one_line(capsys)


def test_engine_names_a_bad_setting_and_a_corrupt_image_path(tmp_path):
    import forkv
    from forkv.engine import GenerationError

    engine = forkv.Engine(load_tiny("qwen3"))
    try:
        with pytest.raises(GenerationError, match="temperature must be a number >= 0.*'hot'"):
            list(engine.stream("hi", temperature="hot"))
    finally:
        engine.close()
    from forkv.engine.vision.images import ImageInput

    bad = tmp_path / "cat.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)  # a PNG signature, then nothing valid
    with pytest.raises(GenerationError, match="Image '.*cat.png' is not a readable image"):
        ImageInput.of(bad).load()


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("forkv.generate_cmd.run_generate", interrupted)
    assert main(["generate", "x"]) == 130
    assert capsys.readouterr().err == "forkv: interrupted\n"


def test_ctrl_c_in_a_real_process():
    # `generate -` waits on stdin (and says so at -v): SIGINT there ends it with 130, one line.
    p = subprocess.Popen([sys.executable, "-m", "forkv.cli", "-v", "generate", "-"], text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=default_sigint)
    assert "reading the prompt from stdin" in p.stderr.readline()
    p.send_signal(signal.SIGINT)
    # Keep stdin open until it has exited: closing it first races the signal (EOF, exit 2).
    p.wait(timeout=60)
    err = p.stderr.read()
    p.stdin.close()
    assert p.returncode == 130 and err == "forkv: interrupted\n", err


@pytest.mark.slow  # a model load and a real generation in a subprocess
def test_ctrl_c_while_generating_removes_the_temp_folder(tmp_path):
    # TMPDIR holds the engine's private store folder; after Ctrl-C nothing of it is left.
    env = dict(os.environ, TMPDIR=str(tmp_path), FORKV_RAM_BUDGET="0")
    p = subprocess.Popen([sys.executable, "-m", "forkv.cli", "generate", "x " * 300,
                          "--model", "demo:qwen3:tiny", "--max-tokens", "4000",
                          "--no-progress"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("forkv-*")) and time.monotonic() < deadline:
            time.sleep(0.2)  # the store folder appears when the engine starts
        assert list(tmp_path.glob("forkv-*")) and p.poll() is None
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    err = err.decode()
    assert p.returncode == 130 and err.endswith("forkv: interrupted\n"), err
    assert "Traceback" not in err and not list(tmp_path.glob("forkv-*"))


def test_a_ctrl_c_a_library_wrapped_still_exits_130(monkeypatch, capsys):
    # A Ctrl-C while `forkv serve` built a pydantic model's validators came out as
    # pydantic-core's SchemaError ("Error building ... validator: KeyboardInterrupt"), and the
    # CLI printed its traceback with status 1.
    from forkv import interrupts

    class SchemaError(Exception):
        pass

    def wrapped(args):
        interrupts._pending = True  # the handler noted the Ctrl-C before raising it
        raise SchemaError('Error building "literal" validator:\n  KeyboardInterrupt: ')

    monkeypatch.setattr(interrupts, "_pending", False)
    monkeypatch.setattr("forkv.generate_cmd.run_generate", wrapped)
    assert main(["generate", "hi"]) == 130
    assert capsys.readouterr().err.strip() == "forkv: interrupted"
    monkeypatch.setattr(interrupts, "_pending", False)

    def bug(args):  # without a Ctrl-C the same error is a bug, and it raises
        raise SchemaError("a schema that does not build")

    monkeypatch.setattr("forkv.generate_cmd.run_generate", bug)
    with pytest.raises(SchemaError):
        main(["generate", "hi"])


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    def reader_left(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("forkv.generate_cmd.run_generate", reader_left)
    assert main(["generate", "x"]) == 0
    assert capsys.readouterr().err == ""


def test_verbose_and_forkv_log_switch_logging(monkeypatch):
    from forkv.cli import setup_logging

    monkeypatch.delenv("FORKV_LOG", raising=False)
    setup_logging(0)
    assert logging.getLogger().level == logging.WARNING
    setup_logging(2)
    assert logging.getLogger().level == logging.DEBUG
    monkeypatch.setenv("FORKV_LOG", "info")
    setup_logging(0)
    assert logging.getLogger().level == logging.INFO
    setup_logging(0)


@pytest.mark.slow  # (2-5 s: out of the fast suite, which must stay under 5 minutes)
def test_help_lists_commands_and_generate_documents_its_options():
    r = subprocess.run([sys.executable, "-m", "forkv.cli", "--help"], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, COLUMNS="100"), check=False)
    assert r.returncode == 0 and "as they land" not in r.stdout
    for cmd in ("demo", "generate", "run", "show", "bench", "doctor"):
        assert f"    {cmd} " in r.stdout, cmd
    r = subprocess.run([sys.executable, "-m", "forkv.cli", "generate", "--help"],
                       capture_output=True, text=True, timeout=60, check=False)
    for flag in ("--max-tokens", "--temperature", "--min-p", "--repetition-penalty",
                 "--logit-bias", "--seed", "--stop", "--chat"):
        line = next(x for x in r.stdout.splitlines() if x.strip().startswith(flag))
        assert len(line.split(maxsplit=2)) > 1, line  # every option has help text
    assert "'-' reads it from stdin" in r.stdout
    r = subprocess.run([sys.executable, "-m", "forkv.cli", "bench", "--help"],
                       capture_output=True, text=True, timeout=60, check=False)
    from forkv.bench import BENCHMARKS

    for name in [*BENCHMARKS, "all"]:
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"  {name} "))
        assert len(line.split()) > 2, line  # named and described
