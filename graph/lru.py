"""A least-recently-used map bounded by entry count and by the summed size of its values.

The render caches keep recent render states by node (render_cache.py by path, chat_render.py by
chat); each bounds how many it keeps and how much they hold. Thread-safe: the server renders one
tree from several threads. Always keeps the newest entry, however big.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class SizedLRU:
    def __init__(self, limits: Callable[[], tuple[int, int]], size_of: Callable[[Any], int]):
        """`limits()`: (most entries, most summed size), read at each put (module settings
        that tests and users may change); `size_of(value)`: a value's size."""
        self._limits = limits
        self._size_of = size_of
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> Any:
        """The value under `key` or None; not a use (`touch` marks one)."""
        return self._items.get(key)

    def touch(self, key: Hashable) -> None:
        """`key` was used: the last to be evicted."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            self._size += self._size_of(value) - (self._size_of(old) if old is not None else 0)
            self._items[key] = value
            max_entries, max_size = self._limits()
            while len(self._items) > 1 and (len(self._items) > max_entries
                                            or self._size > max_size):
                self._size -= self._size_of(self._items.popitem(last=False)[1])

    def drop(self, which: Callable[[Hashable], bool]) -> None:
        """Forget every entry whose key `which` picks."""
        with self._lock:
            for key in [k for k in self._items if which(k)]:
                self._size -= self._size_of(self._items.pop(key))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._size = 0
