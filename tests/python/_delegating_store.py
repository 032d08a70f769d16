"""A torch store (a Python subclass of ``torch.distributed.Store``) that hands every call to an
inner store, for tests that watch what torch's or ferrodist's code asks of a store: subclasses
override the calls they observe and call ``super()`` for the rest."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as tdist


class DelegatingStore(tdist.Store):
    def __init__(self, inner: tdist.Store) -> None:
        super().__init__()
        self.inner = inner

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def add(self, key: str, value: int) -> int:
        return self.inner.add(key, value)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self.inner.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self.inner.multi_set(keys, values)

    @property
    def timeout(self) -> timedelta:
        return self.inner.timeout
