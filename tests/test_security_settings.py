"""StoreSettings: keywords, FORKV_* env, sizes, switches, validation."""

import pickle

import pytest
from forkv.security import StoreSettings, StoreSettingsError, parse_size
from forkv.security.settings import parse_bool


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        (4096, 4096),
        ("4096", 4096),
        ("512MB", 512 * 10**6),
        ("512M", 512 << 20),
        ("512MiB", 512 << 20),
        ("1GiB", 1 << 30),
        ("1gb", 10**9),
        ("1.5G", 3 << 29),
        (" 2 KiB ", 2048),
        ("10b", 10),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "-1", "1XB", "GB", "1.2.3", -5, True])
def test_parse_size_rejects(bad):
    with pytest.raises(StoreSettingsError):
        parse_size(bad)


def test_parse_bool():
    assert parse_bool("on") and parse_bool("YES") and parse_bool("1") and parse_bool(True)
    assert not (parse_bool("off") or parse_bool("False") or parse_bool("0"))
    with pytest.raises(StoreSettingsError, match="FORKV_DISK"):
        parse_bool("maybe", "FORKV_DISK")


def test_env_and_keyword_overrides():
    env = {
        "FORKV_RAM_BUDGET": "0",
        "FORKV_DISK_BUDGET": "64MiB",
        "FORKV_DISK_DIR": "/x",
        "FORKV_QUEUE_MAX": "3",
    }
    s = StoreSettings.from_env(env)
    assert (s.ram_budget, s.disk_budget, s.disk_dir, s.queue_max) == (0, 64 << 20, "/x", 3)
    assert s.mode == "ephemeral"
    s = StoreSettings.from_env(env, disk_budget="1GB", ram_budget=5)
    assert (s.ram_budget, s.disk_budget) == (5, 10**9)


def test_off_switches():
    assert StoreSettings.from_env({"FORKV_DISK": "off"}).mode == "off"
    assert StoreSettings.from_env({}, disk_budget=0).mode == "off"
    assert StoreSettings.from_env({"FORKV_DISK": "off"}, disk=True).mode == "ephemeral"


def test_empty_env_is_unset():
    assert (
        StoreSettings.from_env({"FORKV_DISK_BUDGET": "", "FORKV_PERSIST_PATH": ""}).mode
        == "ephemeral"
    )


def test_bad_env_names_the_variable():
    with pytest.raises(StoreSettingsError, match="FORKV_RAM_BUDGET"):
        StoreSettings.from_env({"FORKV_RAM_BUDGET": "lots"})


def test_unknown_keyword():
    with pytest.raises(TypeError, match="ram_budgt"):
        StoreSettings.from_env({}, ram_budgt=1)


def test_persistent_needs_exactly_one_key_source(tmp_path):
    path = str(tmp_path / "s.fkv")
    with pytest.raises(StoreSettingsError, match="exactly one"):
        StoreSettings.from_env({}, persist_path=path)
    with pytest.raises(StoreSettingsError, match="exactly one"):
        StoreSettings.from_env({}, persist_path=path, passphrase="a", key=bytes(32))
    with pytest.raises(StoreSettingsError, match="persist_path"):
        StoreSettings.from_env({"FORKV_KEY_FILE": "/k"})
    with pytest.raises(StoreSettingsError, match="32 bytes"):
        StoreSettings.from_env({}, persist_path=path, key=b"short")
    env = {"FORKV_PERSIST_PATH": path, "FORKV_PASSPHRASE": "pw"}
    assert StoreSettings.from_env(env).mode == "persistent"


def test_raw_key_never_from_env(tmp_path):
    s = StoreSettings.from_env({"FORKV_KEY": "00" * 32})
    assert s.key is None


def test_secrets_hidden_and_unpicklable(tmp_path):
    s = StoreSettings.from_env({}, persist_path=str(tmp_path / "s"), passphrase="correct horse")
    assert "correct horse" not in repr(s)
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(s)
    plain = StoreSettings.from_env({})
    assert pickle.loads(pickle.dumps(plain)) == plain


@pytest.mark.parametrize("field", ["queue_max", "scrypt_n"])
def test_validation(field):
    with pytest.raises(StoreSettingsError):
        StoreSettings.from_env({}, **{field: 0})
