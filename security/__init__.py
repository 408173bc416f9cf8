"""forkv.security: the encrypted blob store (disk tier of checkpoints).

Records are sealed with AES-256-GCM before they touch the disk, under a key that lives only
in process memory (ephemeral, the default) or that the user supplies (persistent mode).
This package imports only the standard library and ``cryptography``. See README.md for the
threat model.
"""

from .aead import Sealer
from .errors import (
    CorruptStoreError,
    ForkvWarning,
    KeyFileError,
    ModelMismatchError,
    NonceError,
    StoreLockedError,
    StoreSettingsError,
    UnsafePathError,
    WrongKeyError,
)
from .fileio import DiskIO, FaultyIO
from .folder import write_private_file
from .keys import Secret, make_key_file
from .process import HardenReport, harden_process, prepare_process
from .settings import StoreSettings, parse_size
from .store import Blob, BlobStore, StoreStats

__all__ = [
    "Blob",
    "BlobStore",
    "CorruptStoreError",
    "DiskIO",
    "FaultyIO",
    "ForkvWarning",
    "HardenReport",
    "KeyFileError",
    "ModelMismatchError",
    "NonceError",
    "Sealer",
    "Secret",
    "StoreLockedError",
    "StoreSettings",
    "StoreSettingsError",
    "StoreStats",
    "UnsafePathError",
    "WrongKeyError",
    "harden_process",
    "make_key_file",
    "parse_size",
    "prepare_process",
    "write_private_file",
]
