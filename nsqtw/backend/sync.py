"""The disk queues' blocking work (fsync, metadata rewrites, unlinks, closes), in order, off the
reactor thread: one :class:`SyncWorker` per broker, and the jobs it runs."""

from __future__ import annotations

import os
import time
from functools import partial
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Sequence

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from .deferred_store import DeferredStore
from .durability import fsync, without_fsync
from .metadata import write_file_atomically

if TYPE_CHECKING:
    from .disk import DiskQueue

__all__ = ["SyncWorker"]

log = Logger(namespace="nsqtw.diskqueue")


class SyncWorker(Service):
    """
    One broker's blocking disk work, in order, off the reactor thread.

    Add it to the service tree *before* the broker's services (a MultiService
    stops children in reverse, so it stops last): its ``stopService`` runs
    every job already submitted (closing queues submits their final syncs)
    and joins the thread.  Jobs submitted while it is not running run inline.
    """

    def __init__(self, reactor: Any = None, *, clock: Any = None, threaded: bool = True,
                 fsync: bool = True, name: str = "nsqtw-diskqueue-sync", turn: Any = None) -> None:
        """``fsync=False``: a throwaway data directory (see :mod:`.durability`); every job runs
        without its fsyncs.  ``turn`` (a :class:`~nsqtw.runtime.turn.TurnBatcher`) runs the end-of-turn
        sync submission with the broker's other end-of-turn work; without it, one of its own."""
        self.reactor = reactor
        self.clock = clock if clock is not None else reactor
        if turn is None and self.clock is not None:
            from ..runtime.turn import TurnBatcher
            turn = TurnBatcher(self.clock)
        self._turn = turn
        self.threaded = threaded and reactor is not None
        self.fsync = fsync
        self.setName(name)  # type: ignore[no-untyped-call]  # Twisted's Service is unannotated
        self._pool: Any = None
        self._shutdown_trigger: Any = None
        #: the first frame outside nsqtw and Twisted that started it (for the forgotten-stop warning)
        self._started_at = "?"
        self._dirty: dict[int, DiskQueue] = {}
        self._unsynced: dict[int, DiskQueue] = {}
        self.jobs = 0

    # lifecycle
    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]  # Twisted's Service is unannotated
        if self.threaded and self._pool is None:
            from twisted.python.threadpool import ThreadPool
            self._pool = ThreadPool(1, 1, name=self.name)
            self._pool.start()
            self._started_at = _caller()
            # the thread never outlives the reactor, even if nobody stops this worker (an
            # embedded broker whose stop() was forgotten): a process asked to exit exits.  In
            # the "during" phase: twistd stops its application in "before" (after this trigger
            # was added), and that stop, which writes everything out, must come first
            self._shutdown_trigger = self.reactor.addSystemEventTrigger("during", "shutdown",
                                                                        self._reactor_shutdown)

    def stopService(self) -> Any:
        super().stopService()  # type: ignore[no-untyped-call]  # Twisted's Service is unannotated
        self.end_turn()
        trigger, self._shutdown_trigger = self._shutdown_trigger, None
        if trigger is not None:
            try:
                self.reactor.removeSystemEventTrigger(trigger)
            except (ValueError, KeyError):  # the shutdown is under way: it ran or is running
                pass
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()  # runs what is queued, then joins the thread
        return None

    def _reactor_shutdown(self) -> None:
        """The reactor stops while this worker still runs (its broker was never stopped): run
        what is queued and end the thread, so the process can exit."""
        self._shutdown_trigger = None
        if self._pool is None:
            return
        log.warn("the reactor is stopping but the broker started at {where} was never stopped: "
                 "ending its disk sync thread (call its stop() before the reactor stops)",
                 where=self._started_at)
        self.end_turn()
        pool, self._pool = self._pool, None
        pool.stop()

    def seconds(self) -> float:
        return self.clock.seconds() if self.clock is not None else time.time()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Any:
        if self.clock is None:
            return None
        return self.clock.callLater(delay, fn)

    def submit(self, fn: Callable[[], Any]) -> Deferred[Any]:
        """Run ``fn`` after every job submitted before; fires with its result."""
        self.jobs += 1
        if not self.fsync:
            fn = partial(without_fsync, fn)
        pool = self._pool
        if pool is None:
            try:
                return succeed(fn())
            except BaseException:
                return fail(Failure())
        from twisted.internet.threads import deferToThreadPool
        return deferToThreadPool(self.reactor, pool, fn)

    def run_here(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` now, on this thread, with this worker's fsync setting (start-up writes)."""
        return fn() if self.fsync else without_fsync(fn)

    def flush_and_sync_all(self) -> Deferred[Any]:
        """Fires once every message put so far, in any queue of this worker, is fsynced.

        The broker's ``--sync-every=1`` OK: publish, then answer when this fires
        (``E_PUB_FAILED`` if it fails with :class:`~nsqtw.errors.BackendError`).
        """
        queues = list(self._unsynced.values())
        if not queues:
            return succeed(None)
        from twisted.internet.defer import FirstError, gatherResults

        def unwrap(f: Failure) -> Failure:
            return f.value.subFailure if f.check(FirstError) else f

        d = gatherResults([q.flush_and_sync() for q in queues], consumeErrors=True)
        return d.addCallbacks(lambda _: None, unwrap)

    # end of turn
    def wake(self, queue: DiskQueue) -> None:
        """``queue`` has work for the end of this reactor turn (a sync to submit)."""
        if self.clock is None:
            queue._end_turn()
            return
        self._dirty[id(queue)] = queue
        self._turn.soon(self.end_turn)

    def end_turn(self) -> None:
        """Submit the syncs queues asked for now (the glue may call this at the end of settle)."""
        dirty = self._dirty
        while dirty:
            _, q = dirty.popitem()
            try:
                q._end_turn()
            except Exception:
                log.failure("DISKQUEUE({name}) end of turn failed", name=q.name)


_INLINE: SyncWorker | None = None


def _inline_worker() -> SyncWorker:
    global _INLINE
    if _INLINE is None:
        _INLINE = SyncWorker(None, threaded=False)
    return _INLINE


def _caller() -> str:
    """``file:line`` of the innermost frame on the stack outside nsqtw, Twisted and the stdlib's
    asyncio (who started a broker), or ``?``."""
    import traceback

    skip = (os.sep + "nsqtw" + os.sep, os.sep + "twisted" + os.sep, os.sep + "asyncio" + os.sep)
    for frame in reversed(traceback.extract_stack(limit=40)):
        if not any(part in frame.filename for part in skip):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


# --- jobs (run on the worker thread; they only see values handed to them) ---------------------

def _job_sync(fd: int | None, meta_path: str, meta: bytes,
              hints: tuple[DeferredStore, list[tuple[float, bytes]], float] | None,
              close_fd: bool = False) -> None:
    try:
        if fd is not None:
            fsync(fd)
        write_file_atomically(meta_path, meta)
        if hints is not None:
            store, items, now = hints
            store.save(items, now)
    finally:
        if close_fd and fd is not None:
            os.close(fd)


def _job_close(fd: int, sync: bool) -> None:
    try:
        if sync:
            fsync(fd)
    finally:
        os.close(fd)


def _job_unlink(paths: Sequence[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.error("DISKQUEUE failed to remove {path} - {err}", path=p, err=e)
