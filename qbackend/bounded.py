"""A bounded, thread-safe memo: the one kind of cache qbackend keeps on a per-call path.

Every cache whose key holds a shape or a problem is one of these, so that a server seeing ever new
batch sizes or shapes keeps a fixed amount of state: past `maxsize` entries the least recently used
one is dropped (it is recomputed if it comes back). Lookups and inserts take a lock: threads that
call qbackend at the same time (ctypes releases the GIL during kernel calls) never see a half-made
entry, and `get_or_make` builds a missing value once per key even when several threads ask for it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

_MISSING = object()


class BoundedCache:
    def __init__(self, maxsize: int, name: str = ""):
        if maxsize < 1:
            raise ValueError(f"BoundedCache: maxsize must be >= 1; got {maxsize}")
        self.maxsize = maxsize
        self.name = name
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.RLock()  # re-entrant: a make() may look up another key

    def get(self, key, default=None):
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                return default
            self._data.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def get_or_make(self, key, make):
        """The cached value for key, else make() stored under it; make runs under the cache's lock,
        so it must be quick and must not wait for another thread."""
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                value = make()
                self.put(key, value)
            else:
                self._data.move_to_end(key)
            return value

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __repr__(self) -> str:
        return f"BoundedCache({self.name!r}, {len(self)}/{self.maxsize})"


# Every bounded cache, by name, for tests and `qbackend info --json`-style inspection.
_all: dict = {}
_all_lock = threading.Lock()


def cache(name: str, maxsize: int) -> BoundedCache:
    """A new BoundedCache registered under name (a later one of the same name replaces it: a
    registry rebuilt by reload() makes fresh caches)."""
    c = BoundedCache(maxsize, name)
    with _all_lock:
        _all[name] = c
    return c


def sizes() -> dict:
    """{name: (entries, bound)} of every registered cache."""
    with _all_lock:
        return {name: (len(c), c.maxsize) for name, c in _all.items()}
