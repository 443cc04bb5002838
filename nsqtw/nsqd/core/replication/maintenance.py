"""
Planned maintenance (sans-IO): an origin going down on purpose tells its peers (a MAINT frame)
not to adopt it for a while; each peer keeps that window on its own clock, through the link's
loss, until the time is up or the origin is back (:class:`MaintenanceWindows`); the peer's
adoption keeps an origin that is due back while it is in a window, whatever decided it was due
(the adoption policy), and adopts it once the window is over if it has not come back.
"""

from __future__ import annotations

__all__ = ["MaintenanceWindows"]


class MaintenanceWindows:
    """Each origin's maintenance window on this peer: until when (this node's clock) it is not
    adopted.  A window ends when its time is up, or when the origin links again after its
    links went down (it is back)."""

    def __init__(self) -> None:
        #: origin -> until when (seconds on this node's clock)
        self.until: dict[int, float] = {}
        #: origins whose links went down since their window was set
        self._went_down: set[int] = set()

    def set(self, origin: int, seconds: float, now: float) -> None:
        """The origin asked for ``seconds`` without adoption (0 or less: its window is over)."""
        if seconds <= 0:
            self.until.pop(origin, None)
        else:
            self.until[origin] = now + seconds
        self._went_down.discard(origin)

    def restore(self, origin: int, until: float) -> None:
        """A window kept across this node's restart (its links are down)."""
        self.until[origin] = until
        self._went_down.add(origin)

    def active(self, origin: int, now: float) -> bool:
        """The origin is in a window now (a window whose time is up is forgotten)."""
        until = self.until.get(origin)
        if until is None:
            return False
        if now >= until:
            del self.until[origin]
            self._went_down.discard(origin)
            return False
        return True

    def remaining(self, now: float) -> dict[int, float]:
        """Each origin in a window and the seconds left of it."""
        return {o: round(u - now, 3) for o, u in sorted(self.until.items()) if u > now}

    def down(self, origin: int) -> None:
        if origin in self.until:
            self._went_down.add(origin)

    def up(self, origin: int) -> bool:
        """The origin linked: True when that ends its window (its links had gone down: it is back)."""
        if origin in self._went_down:
            self._went_down.discard(origin)
            self.until.pop(origin, None)
            return True
        return False
