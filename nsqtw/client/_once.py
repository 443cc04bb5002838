"""A result many callers can wait for (each gets its own Deferred)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure

__all__ = ["Once"]

_UNSET = object()


class Once:
    """Fires once; :meth:`when` gives a fresh Deferred before or after that."""

    def __init__(self) -> None:
        self._result: Any = _UNSET
        self._waiters: list[defer.Deferred[Any]] = []

    @property
    def called(self) -> bool:
        return self._result is not _UNSET

    def when(self) -> defer.Deferred[Any]:
        if self._result is _UNSET:
            d: defer.Deferred[Any] = defer.Deferred()
            self._waiters.append(d)
            return d
        if isinstance(self._result, Failure):
            return defer.fail(self._result)
        return defer.succeed(self._result)

    def fire(self, result: Any = None) -> None:
        if self._result is not _UNSET:
            return
        self._result = result
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(result)
