"""Key material: redacted secrets, the per-process ephemeral key, key files and passphrases.

Knows: where a 32-byte master key comes from (``os.urandom``, a key file, scrypt of a
passphrase), how to derive per-session data keys from it (HKDF-SHA256) and a key-check value
(HMAC-SHA256), and that a forked child must forget every key it inherited. Does not know:
files of the store, nonces or records. Python cannot wipe memory reliably: ``wipe()`` zeroes
our own buffers, but copies made by ``bytes()``, OpenSSL or the allocator may survive.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import stat
import weakref
from collections.abc import Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from .errors import KeyFileError, UnsafePathError
from .folder import check_parents
from .memory import secure_buffer

__all__ = ["KEY_SIZE", "MasterKey", "Secret", "forget_in_child", "make_key_file"]

KEY_SIZE = 32
_NO_PICKLE = "{} cannot be pickled: key material never leaves process memory; pass the key again."
_fork_hooks: weakref.WeakSet = weakref.WeakSet()


def forget_in_child(obj: object) -> None:
    """Call ``obj._forget_after_fork()`` in a forked child, so it never reuses keys or nonces."""
    _fork_hooks.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_fork_hooks):
        obj._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Secret:
    """Bytes that never show in ``repr``/``str`` and refuse to be pickled."""

    __slots__ = ("__weakref__", "_buf")

    def __init__(self, value: bytes | bytearray | memoryview | str) -> None:
        if isinstance(value, str):
            value = value.encode("utf-8")
        self._buf = secure_buffer(value)  # its own page, left out of core dumps

    def reveal(self) -> bytes:
        """The secret bytes (a copy the caller should drop quickly)."""
        return bytes(self._buf)

    def wipe(self) -> None:
        """Zero our buffer (best effort; see the module docstring)."""
        self._buf[:] = bytes(len(self._buf))

    def __len__(self) -> int:
        return len(self._buf)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._buf, other._buf)

    def __hash__(self) -> int:
        return hash(len(self._buf))  # consistent with __eq__, leaks only the length

    def __repr__(self) -> str:
        return "Secret(<redacted>)"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError(_NO_PICKLE.format("Secret"))

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict) -> Secret:
        return self


class MasterKey:
    """A 32-byte master key, in process memory only; derives session keys and check values."""

    __slots__ = ("__weakref__", "_buf", "source")

    def __init__(self, key: bytes | bytearray, source: str) -> None:
        assert len(key) == KEY_SIZE, "master keys are 32 bytes"
        self._buf: memoryview | bytearray = secure_buffer(key)
        self.source = source  # 'ephemeral', 'key_file', 'passphrase' or 'key'
        forget_in_child(self)

    @classmethod
    def make_ephemeral(cls) -> MasterKey:
        """A fresh random key for this process; it is never written anywhere."""
        return cls(os.urandom(KEY_SIZE), "ephemeral")

    @classmethod
    def from_secret(cls, secret: Secret) -> MasterKey:
        return cls(secret._buf, "key")

    @classmethod
    def from_key_file(cls, path: str) -> MasterKey:
        """Read a key file: 32 raw bytes, 64 hex digits or base64; must be ours and private
        (0600), in a folder other users cannot write to."""
        key = _read_key_file(path)
        try:
            return cls(key._buf, "key_file")
        finally:
            key.wipe()

    @classmethod
    def from_passphrase(
        cls, passphrase: Secret, salt: bytes, n: int, r: int = 8, p: int = 1
    ) -> MasterKey:
        """scrypt(passphrase, salt); the salt and cost live in the persistent file header."""
        kdf = Scrypt(salt=salt, length=KEY_SIZE, n=n, r=r, p=p)
        return cls(kdf.derive(bytes(passphrase._buf)), "passphrase")

    def derive(self, salt: bytes, info: bytes) -> bytearray:
        """HKDF-SHA256 subkey; a fresh salt per session keeps (key, nonce) pairs unique."""
        self._check_alive()
        kdf = HKDF(algorithm=hashes.SHA256(), length=KEY_SIZE, salt=salt, info=info)
        return bytearray(kdf.derive(bytes(self._buf)))

    def check_value(self, label: bytes) -> bytes:
        """A MAC that tells a wrong key from a corrupt file without decrypting anything."""
        self._check_alive()
        return hmac.new(bytes(self._buf), b"forkv key check v1|" + label, hashlib.sha256).digest()

    def mac(self, domain: bytes, data: bytes) -> bytes:
        """HMAC-SHA256 of ``data`` under a subkey for ``domain`` (e.g. the store header)."""
        self._check_alive()
        subkey = bytes(self.derive(b"", b"forkv mac v1|" + domain))
        return hmac.new(subkey, data, hashlib.sha256).digest()

    def wipe(self) -> None:
        self._buf[:] = bytes(len(self._buf))
        self._buf = bytearray()  # the page is unmapped once the last view of it goes

    def _forget_after_fork(self) -> None:
        self.wipe()

    def _check_alive(self) -> None:
        if len(self._buf) != KEY_SIZE:
            raise RuntimeError("This key was wiped (store closed, or inherited across fork).")

    def __repr__(self) -> str:
        return f"MasterKey(source={self.source!r}, key=<redacted>)"

    def __reduce__(self):
        raise TypeError(_NO_PICKLE.format("MasterKey"))


def _read_key_file(path: str) -> Secret:
    # Key bytes live only in Secrets here and in _decode_key, which never raises: a traceback
    # (even one printed with its locals) cannot show them.
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafePathError(
                f"Key file {path} is a symlink; point FORKV_KEY_FILE at the real file."
            ) from None
        raise KeyFileError(f"Cannot read key file {path}: {exc.strerror}.") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"Key file {path} is not a regular file.")
        if info.st_uid != os.geteuid():
            raise UnsafePathError(
                f"Key file {path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); "
                "copy it to a file you own and `chmod 600` it."
            )
        if info.st_mode & 0o077:
            raise UnsafePathError(
                f"Key file {path} is readable by other users; run `chmod 600 {path}`."
            )
        check_parents(path, f"Key file {path}")
        contents = Secret(os.read(fd, 4096))
    finally:
        os.close(fd)
    key = _decode_key(contents)
    contents.wipe()
    if key is None:
        raise KeyFileError(
            f"Key file {path} does not hold a 32-byte key (raw, 64 hex digits or base64); "
            "make one with forkv.security.make_key_file(path)."
        )
    return key


def _decode_key(contents: Secret) -> Secret | None:
    """The 32-byte key in a key file's contents, or None; never raises (see above)."""
    raw = bytes(contents._buf)
    if len(raw) == KEY_SIZE:
        return Secret(raw)
    text = raw.strip()
    decoders: list[Callable[[bytes], bytes]] = [
        lambda t: bytes.fromhex(t.decode("ascii")),
        lambda t: base64.b64decode(t, validate=True),
    ]
    for decode in decoders:
        try:
            key = decode(text)
        except (ValueError, binascii.Error):
            continue
        if len(key) == KEY_SIZE:
            return Secret(key)
    return None


def make_key_file(path: str) -> None:
    """Write a new random 32-byte key as hex to ``path`` (mode 0600); refuses to overwrite."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, os.urandom(KEY_SIZE).hex().encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
