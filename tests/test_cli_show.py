"""`forkv show TREE.json` writes the tree viewer's page with the tree inlined; `forkv demo` runs
the branch-and-prune agent."""

import forkv
from conftest import load_tiny
from forkv.cli import main


def saved_tree(tmp_path):
    with forkv.Session(load_tiny("qwen3")) as s:
        u = s.system("Review code.").user("def f(x):\n    return x - 1\n" * 20)
        s.run(u.reasoning({"max_tokens": 8}).final({"max_tokens": 4}))
        path = tmp_path / "tree.json"
        s.save(path)
        return path, s.tree


def test_show_writes_a_self_contained_page(tmp_path, capsys):
    path, tree = saved_tree(tmp_path)
    assert main(["show", str(path), "-o", str(tmp_path / "out.html")]) == 0
    assert "out.html (4 nodes)" in capsys.readouterr().out
    page = (tmp_path / "out.html").read_text()
    assert page.lower().startswith("<!doctype html>")
    assert all(n.id in page for n in tree)
    # The run viewer, inlined: its script and the tree's data island, nothing to fetch.
    assert page.count("<script") == 2 and 'id="forkv-tree"' in page and " src=" not in page
    assert main(["show", str(path)]) == 0  # default: next to the tree
    assert (tmp_path / "tree.html").is_file()


def test_show_reports_bad_input(tmp_path, capsys):
    assert main(["show", str(tmp_path / "missing.json")]) == 2
    assert "forkv: error:" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": []}')
    assert main(["show", str(bad)]) == 2
    assert "forkv.tree" in capsys.readouterr().err


def test_demo_prints_reuse_at_each_step(capsys):
    assert main(["demo", "--max-tokens", "4", "--reasoning-tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert "demo:gemma3:tiny" in out and "prune the reasoning" in out
    steps = [line for line in out.splitlines() if line.startswith("  ") and "reused" in line]
    assert len(steps) == 5 and "reused     0" in steps[0]
    assert all("reused     0" not in s for s in steps[1:])
    assert "finish=" in out and "prefill=" in out and "restored from checkpoints" in out
