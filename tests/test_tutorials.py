"""Every tutorial runs as a script on its default tiny demo model and prints what it shows."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"


def run(name, *args, **env_vars):
    env = dict(os.environ, PYTHONIOENCODING="utf-8", **env_vars)
    env.pop("FORKV_PASSPHRASE", None)
    r = subprocess.run([sys.executable, str(TUTORIALS / name), *args], check=False,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_every_tutorial_is_tested_and_documented():
    names = sorted(p.name for p in TUTORIALS.glob("*.py"))
    assert names == ["01_conversation.py", "02_branch_and_prune.py", "03_tree_of_thought.py",
                     "04_private_assistant.py", "05_visual_branch_and_prune.py",
                     "06_tool_agent.py"]
    for name in names:
        text = (TUTORIALS / name).read_text()
        assert text.startswith('"""Tutorial ') and "Run:" in text


def test_01_conversation_on_a_given_model():
    out = run("01_conversation.py", "demo:gemma3:tiny")
    assert "built 3 nodes; f3 is pending" in out
    assert "turn 1 -> f3: reused 0" in out and "turn 2 -> f5: reused " in out
    assert "flowchart TD" in out


@pytest.mark.slow  # the same workflow as `forkv demo`, which test_cli_show runs by default
def test_02_branch_and_prune_reuses_on_every_prune_and_rewind():
    out = run("02_branch_and_prune.py")
    lines = {line.split("  ")[0].strip(): line for line in out.splitlines() if "reused" in line}
    assert "reused     0" in lines["reasoning"] and "generated  320" in lines["reasoning"]
    reused = {step: int(line.split("reused")[1].split()[0]) for step, line in lines.items()}
    prompt = int(lines["reasoning"].split("prompt")[1].split()[0])
    for step in ("follow-up on the pruned path", "other follow-up (rewind)",
                 "second reasoning (rewind)"):
        # past the last block boundary (1280): the user turn's end, where the reasoning began
        assert 1280 < reused[step] < prompt, lines[step]
    assert reused["second reasoning (rewind)"] >= prompt - 8
    assert "system:s1 -> user:u2 -> final:f5 -> user:u6 -> final:f7" in out


@pytest.mark.slow  # forks and keep rules run by default in test_cli_run and the README test
def test_03_tree_of_thought_computes_the_prompt_once():
    out = run("03_tree_of_thought.py")
    branches = [line for line in out.splitlines() if line.startswith("branch ")]
    assert len(branches) == 4 and "reused     0" in branches[0]
    assert all("reused     0" not in b for b in branches[1:])
    assert "kept r" in out and "removed the other 3" in out


@pytest.mark.slow  # a persisted store across sessions runs by default in test_security_persist
def test_04_private_assistant_resumes_from_the_encrypted_store():
    out = run("04_private_assistant.py", FORKV_SCRYPT_N="32768")  # the cheapest KDF forkv accepts
    steps = {line.split(":")[0]: line for line in out.splitlines() if "reused" in line}
    assert "reused     0" in steps["1. first run"]
    for step in ("3. restarted session", "4. new process, resumed"):
        reused = int(steps[step].split("reused")[1].split()[0])
        assert reused >= 1024, steps[step]  # restored from the encrypted file
    assert "2. wrong passphrase refused" in out
    assert "checkpoints.fkv, tree.json" in out


@pytest.mark.slow  # image reuse across branches runs by default in test_vision_families
def test_05_visual_branch_and_prune_reuses_the_image():
    pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed (pip install 'forkv[vision]')")
    out = run("05_visual_branch_and_prune.py")
    lines = {line.split("  ")[0].strip(): line for line in out.splitlines() if "reused" in line}
    assert "reused     0" in lines["reasoning about the photo"]
    for step in ("follow-up on the pruned path", "second photo in a later turn",
                 "second reasoning (rewind)"):
        assert "reused   256" in lines[step], lines[step]
    assert "vision tower runs: 2 (2 photos)" in out
    assert "system:s1 -> user:u2 -> final:f5 -> user:u6 -> final:f7 -> user:u8 -> final:f9" in out


@pytest.mark.slow  # 4 forked plans x 2 constrained tool calls, then an answer
def test_06_tool_agent_forks_calls_tools_and_keeps_one_plan():
    out = run("06_tool_agent.py")
    assert "'<start_function_call>call:" in out  # Gemma's call format, written by the model
    steps = [line for line in out.splitlines() if line.startswith("plan ")]
    assert len(steps) == 8 and all(" -> " in line for line in steps)
    assert "reused     0" in steps[0]
    assert all("reused     0" not in line for line in steps[1:])  # every later turn restores
    assert "removed the other 3" in out
    assert out.strip().splitlines()[-1].count("tool:") == 2


@pytest.mark.slow
def test_the_tutorials_on_the_real_chat_model():
    """01 and 03 on `smollm2-135m` (`forkv pull smollm2-135m`): the same reuse, real text."""
    from forkv.engine.models.named import NAMED_MODELS

    if not NAMED_MODELS["smollm2-135m"].is_local():
        pytest.skip("smollm2-135m is not on this machine (forkv pull smollm2-135m)")
    out = run("01_conversation.py", "smollm2-135m")
    streamed = next(line for line in out.splitlines() if line.startswith("turn 2 streaming:"))
    words = streamed.split(":", 1)[1].split()
    assert len(words) >= 8 and sum(w.isascii() for w in words) >= len(words) - 1, streamed
    assert "turn 2 -> f5: reused 1" in out  # the first turn's prompt, restored
    out = run("03_tree_of_thought.py", "smollm2-135m")
    branches = [line for line in out.splitlines() if line.startswith("branch ")]
    assert len(branches) == 4 and "reused     0" in branches[0]
    assert all("reused     0" not in b for b in branches[1:])
