"""paths: a staged folder appears whole or not at all, with its mode; the stage never stays;
a lost race is accepted only when the winner's folder is done; private cache folders."""

import os
import stat

import pytest
from forkv.engine.errors import ModelLoadError
from forkv.engine.paths import cache_root, private_cache_folder, staged_folder


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _write(out, text="new") -> None:
    out.mkdir()
    (out / "model.safetensors").write_text(text)


def test_a_clean_exit_renames_the_folder_into_place(tmp_path):
    folder = tmp_path / "a" / "model"  # parents are made
    with staged_folder(folder) as out:
        assert out.parent.parent == folder.parent and not out.exists()
        _write(out)
    assert (folder / "model.safetensors").read_text() == "new" and _mode(folder) == 0o700
    assert os.listdir(folder.parent) == ["model"]  # the stage is gone


def test_mode_none_keeps_what_the_writer_made(tmp_path):
    folder = tmp_path / "out"
    with staged_folder(folder, mode=None) as out:
        out.mkdir(mode=0o750)
    assert _mode(folder) == 0o750 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failure_leaves_nothing(tmp_path):
    folder = tmp_path / "model"
    with pytest.raises(RuntimeError, match="half"), staged_folder(folder) as out:
        _write(out)
        raise RuntimeError("half written")
    assert os.listdir(tmp_path) == []


def test_an_empty_folder_is_replaced(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    with staged_folder(folder) as out:
        _write(out)
    assert (folder / "model.safetensors").read_text() == "new"


def _lose_the_race(folder, **kw) -> None:
    with staged_folder(folder, **kw) as out:
        _write(out, "ours")
        _write(folder, "theirs")  # a concurrent writer renames first


def test_a_lost_race_keeps_the_winners_done_folder(tmp_path):
    folder = tmp_path / "model"
    _lose_the_race(folder, done=lambda f: (f / "model.safetensors").exists())
    assert (folder / "model.safetensors").read_text() == "theirs"
    assert os.listdir(tmp_path) == ["model"]


@pytest.mark.parametrize("done", [None, lambda f: False], ids=["no done", "not done"])
def test_a_lost_race_raises_unless_the_winner_is_done(tmp_path, done):
    folder = tmp_path / "model"
    with pytest.raises(OSError):
        _lose_the_race(folder, done=done)
    assert (folder / "model.safetensors").read_text() == "theirs"
    assert os.listdir(tmp_path) == ["model"]


def test_private_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKV_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache"
    (tmp_path / "cache").mkdir(mode=0o755)
    (tmp_path / "cache" / "loose").mkdir(mode=0o777)
    os.chmod(tmp_path / "cache" / "loose", 0o777)
    assert _mode(private_cache_folder("loose")) == 0o700  # ours: tightened
    assert _mode(private_cache_folder("a/b")) == 0o700
    (tmp_path / "shared").mkdir(mode=0o755)
    os.chmod(tmp_path / "shared", 0o755)
    os.symlink(tmp_path / "shared", tmp_path / "cache" / "link")
    with pytest.raises(ModelLoadError, match="not a private folder"):
        private_cache_folder("link")
    assert _mode(tmp_path / "shared") == 0o755  # not tightened through the link
