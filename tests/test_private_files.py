"""Every file forkv writes that holds conversation content is 0600 from the moment it exists —
`forkv show`'s page, `forkv run --save` and its default output, `forkv demo --save`,
Session.save, Tree.save, WorkflowSpec.save, benchmark JSON — also over an existing 0644 file,
all through one helper (`forkv.security.write_private_file`, issue 32)."""

import json
import os
import stat

import forkv
import pytest
from conftest import load_tiny
from forkv.bench.common import write_json
from forkv.cli import main
from forkv.graph import Tree, WorkflowSpec, write_html
from forkv.security import UnsafePathError, write_private_file

SECRET = "a secret question about the bakery"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small run tree, saved once: (its path, the session's tree)."""
    with forkv.Session(load_tiny("qwen3")) as s:
        s.run(s.system("Be brief.").user(SECRET).final({"max_tokens": 2}))
        path = tmp_path_factory.mktemp("saved") / "tree.json"
        s.save(path)
        return path, s.tree


def _session_save(path, saved):
    with forkv.Session(load_tiny("qwen3"), tree=Tree.load(saved[0])) as s:
        s.save(path)


def _show(path, saved):
    assert main(["show", str(saved[0]), "-o", str(path)]) == 0


def _run_save(path, saved):
    spec = {"model_id": "demo:qwen3:tiny", "nodes": [
        {"id": "u", "kind": "user", "text": SECRET},
        {"id": "a", "parent": "u", "kind": "final", "gen": {"max_tokens": 2}}]}
    src = path.parent / "flow.json"
    src.write_text(json.dumps(spec))
    assert main(["run", str(src), "--save", str(path), "--no-progress"]) == 0


def _demo_save(path, saved, monkeypatch):
    from forkv import sdk_demo

    monkeypatch.setenv("FORKV_DISK", "off")
    monkeypatch.setattr(sdk_demo, "CODE", "def f(x):\n    return x - 1\n")
    monkeypatch.setattr(sdk_demo, "SYSTEM", "Review code.")
    assert sdk_demo.run_demo("demo:qwen3:tiny", max_tokens=2, reasoning_tokens=4,
                             save=str(path)) == 0


WRITERS = {
    "write_private_file": lambda path, saved: write_private_file(path, SECRET.encode()),
    "Tree.save": lambda path, saved: saved[1].save(path),
    "write_html": lambda path, saved: write_html(saved[1], path),
    "forkv show -o": _show,
    "Session.save": _session_save,
    "forkv run --save": _run_save,
    "WorkflowSpec.save json": lambda path, saved: saved[1].to_spec().save(path),
    "WorkflowSpec.save yaml": lambda path, saved: saved[1].to_spec().save(
        path.with_suffix(".yaml")),
    "bench write_json": lambda path, saved: write_json({"prompt": SECRET}, path),
}


@pytest.mark.parametrize("existing", [False, True], ids=["new", "over-0644"])
@pytest.mark.parametrize("writer", [*WRITERS, "forkv demo --save"])
def test_each_writer_makes_a_0600_file(writer, existing, saved, tmp_path, monkeypatch):
    os.umask(0o022)  # the usual umask: a plain open() would make 0644
    path = tmp_path / "out.json"
    target = path.with_suffix(".yaml") if writer.endswith("yaml") else path
    if existing:
        target.write_text("old")
        target.chmod(0o644)
    if writer == "forkv demo --save":
        _demo_save(path, saved, monkeypatch)
    else:
        WRITERS[writer](path, saved)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600, writer
    assert target.read_text() != "old"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_forkv_show_and_run_default_outputs_are_0600(saved, tmp_path, monkeypatch):
    os.umask(0o022)
    tree = tmp_path / "tree.json"
    tree.write_bytes(saved[0].read_bytes())
    page = tmp_path / "tree.html"  # `forkv show`'s default: next to the tree
    page.write_text("old")
    page.chmod(0o644)
    assert main(["show", str(tree)]) == 0
    assert stat.S_IMODE(page.stat().st_mode) == 0o600 and SECRET in page.read_text()
    monkeypatch.chdir(tmp_path)
    spec = {"model_id": "demo:qwen3:tiny", "nodes": [{"id": "u", "kind": "user", "text": SECRET},
            {"id": "a", "parent": "u", "kind": "final", "gen": {"max_tokens": 2}}]}
    (tmp_path / "flow.json").write_text(json.dumps(spec))
    assert main(["run", "flow.json", "--no-progress"]) == 0
    out = tmp_path / "flow.tree.json"  # `forkv run`'s default: SPEC's name + .tree.json
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and SECRET in out.read_text()


def test_a_reader_of_the_old_file_never_sees_the_new_content(tmp_path):
    """The new content goes to a new 0600 file renamed over the old one: someone who opened
    the 0644 file before sees its old bytes only, and a failed write leaves it whole."""
    path = tmp_path / "tree.json"
    path.write_text("old")
    path.chmod(0o644)
    with open(path) as reader:
        write_private_file(path, SECRET)
        assert reader.read() == "old"
    assert path.read_text() == SECRET and stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(TypeError):
        write_private_file(path, 42)  # not bytes: nothing written, nothing left over
    assert path.read_text() == SECRET and os.listdir(tmp_path) == ["tree.json"]


def test_private_writes_refuse_links_and_files_of_others(tmp_path):
    target = tmp_path / "elsewhere.html"
    link = tmp_path / "page.html"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symlink"):
        write_html(Tree(), link)
    assert not target.exists()
    with pytest.raises(UnsafePathError, match="regular file"):
        WorkflowSpec(nodes=[]).save(tmp_path)  # a folder
