"""A ``LoopingCall`` that runs while its service runs (queue scans, retries, memory trims)."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from twisted.application.service import Service
from twisted.internet import task
from twisted.logger import Logger

__all__ = ["LoopService"]

log = Logger(namespace="nsqtw")


class LoopService(Service):
    """Call ``step`` every ``interval`` seconds on the injected ``clock`` while running (the
    first call one interval after the start); a failing step is logged and the loop goes on."""

    def __init__(self, clock: Any, interval: float, step: Callable[[], Any], name: str) -> None:
        self.clock = clock
        self.interval = interval
        self.step = step
        self.setName(name)
        self._loop: task.LoopingCall | None = None

    def _safe_step(self) -> None:
        try:
            self.step()
        except Exception:
            log.failure("{name} step failed", name=self.name)

    def startService(self) -> None:
        super().startService()
        self._loop = task.LoopingCall(self._safe_step)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=False)

    def stopService(self) -> Any:
        super().stopService()
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            loop.stop()
        return None
