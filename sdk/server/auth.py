"""Tenants: who a request is (API key) and which checkpoint namespace it may use.

Without `--api-key` every request is the one anonymous tenant. With keys, a request must
carry `Authorization: Bearer KEY`; each key is its own tenant, named by a hash of the key (the
key itself is never stored or logged). A request's `cache_salt` (vLLM's field) narrows the
namespace further: same tenant, other salt, no shared checkpoints. Knows nothing about models.
"""

from __future__ import annotations

import hashlib
import hmac

from .errors import APIError

__all__ = ["Tenants", "namespace_of"]


class Tenants:
    def __init__(self, api_keys: list[str] | tuple[str, ...] = ()):
        self._keys = {k: "t" + hashlib.sha256(k.encode()).hexdigest()[:16] for k in api_keys}

    @property
    def is_open(self) -> bool:
        return not self._keys

    def tenant(self, authorization: str | None) -> str:
        """The tenant id of a request's Authorization header ("" when the server is open)."""
        if not self._keys:
            return ""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, "This server needs an API key: send 'Authorization: Bearer "
                                "KEY' (the openai client's api_key).", "invalid_api_key")
        token = token.strip()
        for key, tenant in self._keys.items():
            if hmac.compare_digest(key.encode(), token.encode()):
                return tenant
        raise APIError(401, "The API key is not valid for this server; check the key it was "
                            "started with (--api-key).", "invalid_api_key")


def namespace_of(tenant: str, cache_salt: object = None) -> str:
    """The engine namespace of a tenant's request: its tenant id, salted by `cache_salt`."""
    if cache_salt is None or cache_salt == "":
        return tenant
    if not isinstance(cache_salt, str) or len(cache_salt) > 256:
        raise APIError(400, "cache_salt must be a string of at most 256 characters.",
                       "invalid_value", "cache_salt")
    return f"{tenant}/salt:{hashlib.sha256(cache_salt.encode()).hexdigest()[:16]}"
