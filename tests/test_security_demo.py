"""Nothing of a conversation is left readable on disk: `forkv demo` writes its tree only where
the user asks, as a 0600 file; private files refuse links and loose folders (issue 15, 8)."""

import os
import tempfile

import pytest
from forkv import sdk_demo
from forkv.graph import Tree
from forkv.sdk_demo import run_demo
from forkv.security import UnsafePathError, write_private_file


def test_demo_writes_the_tree_only_where_asked_and_0600(tmp_path, monkeypatch, capsys):
    system_tmp = tmp_path / "system-tmp"  # where the old demo left forkv-demo-tree.json (0644)
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    monkeypatch.setenv("FORKV_DISK", "off")  # the disk tier's folder is not what we look for
    monkeypatch.setattr(sdk_demo, "CODE", "def f(x):\n    return x - 1\n")  # short prompts
    monkeypatch.setattr(sdk_demo, "SYSTEM", "Review code.")
    out = tmp_path / "mine" / "tree.json"
    out.parent.mkdir()
    assert run_demo("demo:qwen3:tiny", max_tokens=2, reasoning_tokens=4, save=str(out)) == 0
    assert os.stat(out).st_mode & 0o777 == 0o600 and len(Tree.load(out)) > 3
    assert os.listdir(system_tmp) == []  # without --save nothing at all is written
    assert f"saved to {out} (mode 0600)" in capsys.readouterr().out


def test_write_private_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("old")
    os.chmod(path, 0o644)
    write_private_file(path, b"new")
    assert path.read_bytes() == b"new" and os.stat(path).st_mode & 0o777 == 0o600
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(UnsafePathError, match="symlink"):
        write_private_file(tmp_path / "link", b"x")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafePathError, match="chmod go-w"):
        write_private_file(shared / "t.json", b"x")
