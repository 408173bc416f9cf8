"""Typed errors subclass the matching builtins, so callers can catch either."""

import pytest
from forkv.security import (
    CorruptStoreError,
    ForkvWarning,
    KeyFileError,
    NonceError,
    StoreLockedError,
    StoreSettingsError,
    UnsafePathError,
    WrongKeyError,
)


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (StoreSettingsError, ValueError),
        (UnsafePathError, PermissionError),
        (KeyFileError, ValueError),
        (WrongKeyError, ValueError),
        (CorruptStoreError, ValueError),
        (StoreLockedError, OSError),
        (NonceError, ValueError),
        (ForkvWarning, UserWarning),
    ],
)
def test_hierarchy(error, builtin):
    assert issubclass(error, builtin)
