"""One engine, one worker thread: requests run one at a time, in arrival order.

The engine is blocking and not thread-safe, so every generation runs on the single thread of a
:class:`Worker`. The event loop hands it a :class:`Job` (functions that start ``engine.stream``
generators, one per choice, run one after another); the worker sends back :class:`Piece`
objects, plain data that is safe to read on the loop's thread. At most ``max_queue`` jobs wait behind the running one;
:meth:`Worker.submit` raises :class:`QueueFullError` beyond that.

Cancelling a job (the client went away, or the server is stopping) stops it at the end of the
current verification round: the worker closes the generator, which leaves the engine ready for
the next job.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from ..core.stats import Stats
from ..errors import EdgespecError
from ..runtime.engine import Chunk

log = logging.getLogger("edgespec.server")


class QueueFullError(Exception):
    """The queue already holds ``max_queue`` waiting jobs."""


class ShuttingDownError(Exception):
    """The worker is stopping: the job will not run (or was stopped part way)."""


class BackendLostError(Exception):
    """The engine can no longer run (its RPC worker died or stopped answering): the job ended
    with it, and the server is about to exit."""


class InternalError(Exception):
    """The generation failed with a bug (logged with its traceback on the server)."""


@dataclass(frozen=True)
class Piece:
    """Confirmed text from one verification round of choice ``choice``. A choice's last piece
    has ``finish_reason`` and ``stats`` (``Stats.to_dict()`` of its whole generation).
    ``detail``: what the job's ``detail`` function made of the chunk on the worker's thread
    (the tokens' log-probabilities), or None."""

    text: str
    finish_reason: str | None = None
    stats: dict[str, Any] | None = None
    choice: int = 0
    detail: Any = None


_END = object()


class Job:
    """One request's generations: each of ``starts`` returns an ``engine.stream`` generator
    (one choice) the worker drains, one after another. ``detail(chunk)``, if given, runs on the
    worker's thread for every chunk; its result travels in :attr:`Piece.detail`.

    Create it on the event loop's thread (it binds to the running loop); read its output there
    with :meth:`next`.
    """

    def __init__(self, *starts: Callable[[], Iterator[Chunk]],
                 detail: Callable[[Chunk], Any] | None = None) -> None:
        if not starts:
            raise ValueError("a job needs at least one generation")
        self._starts = starts
        self._detail = detail
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        self._cancelled = threading.Event()
        self._cancel_error: BaseException | None = None
        self._error_read = threading.Event()  #: the reader has been handed an error
        #: how the job ended (set on the worker thread): completed, cancelled or failed
        self.outcome = "cancelled"

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, error: BaseException | None = None) -> None:
        """Stop the job at the end of its current round (or skip it if it is still queued).
        ``error``, if given, is what :meth:`next` raises instead of ending quietly."""
        if not self._cancelled.is_set():
            self._cancel_error = error
            self._cancelled.set()

    async def next(self) -> Piece | None:
        """The next piece; ``None`` after the last one. Raises the generation's error
        (:class:`EdgespecError`, :class:`InternalError`, :class:`ShuttingDownError`)."""
        item = await self._events.get()
        if item is _END:
            self._events.put_nowait(_END)  # later calls keep seeing the end
            return None
        if isinstance(item, BaseException):
            self._events.put_nowait(_END)
            self._error_read.set()
            raise item
        return item

    def fail(self, error: BaseException) -> None:
        """End the job with ``error`` now, from any thread (its generation may never return)."""
        self.outcome = "failed"
        self._cancelled.set()
        self._emit(error)

    # ---- worker side ------------------------------------------------------------------------

    def _emit(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self._cancelled.set()

    def _run(self) -> list[Stats]:
        """Drain the generators on the worker thread, one choice after another; returns the
        stats of each choice that started."""
        done: list[Stats] = []
        for index, start in enumerate(self._starts):
            if self.cancelled:
                break
            if index:
                self.outcome = "cancelled"  # until this choice completes too
            stats, ended = self._run_one(index, start)
            if stats is not None:
                done.append(stats)
            if not ended:
                break
        self._finish()
        return done

    def _run_one(self, index: int, start: Callable[[], Iterator[Chunk]]) -> tuple[Stats | None, bool]:
        """One choice: (its last stats, whether it ran to its end)."""
        stats = None
        generator = None
        ended = False
        try:
            generator = start()
            for chunk in generator:
                stats = chunk.stats
                final = chunk.finish_reason is not None
                detail = self._detail(chunk) if self._detail is not None else None
                self._emit(Piece(chunk.text, chunk.finish_reason,
                                 stats.to_dict() if final else None, index, detail))
                if final:
                    self.outcome = "completed"
                    ended = True
                elif self.cancelled:
                    break
        except EdgespecError as err:
            self.outcome = "failed"
            self._emit(err)
        except Exception:
            self.outcome = "failed"
            log.exception("generation failed")
            self._emit(InternalError("generation failed"))
        finally:
            if generator is not None:
                generator.close()  # the engine's own cleanup: ready for the next job
        return stats, ended

    def _finish(self) -> None:
        stopped = self.cancelled and self.outcome != "completed"
        self._emit(self._cancel_error if stopped and self._cancel_error else _END)


class Worker:
    """The one thread that runs generations, fed by a bounded first-in first-out queue.

    ``on_done(job, stats, seconds)`` is called on the worker thread after each job (for
    metrics), ``stats`` the list of its choices' stats.
    """

    def __init__(self, max_queue: int,
                 on_done: Callable[[Job, Sequence[Stats], float], None] | None = None) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_queue = max_queue
        self._on_done = on_done
        self._pending: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._closed = False
        self._cond = threading.Condition(threading.RLock())
        self._thread = threading.Thread(target=self._loop, name="edgespec-worker", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        """Jobs waiting (not counting the running one or cancelled ones)."""
        with self._cond:
            return sum(not job.cancelled for job in self._pending)

    @property
    def busy(self) -> bool:
        """Whether a generation is running."""
        with self._cond:
            return self._running is not None

    def submit(self, job: Job) -> None:
        """Queue ``job``; :class:`QueueFullError` if ``max_queue`` jobs already wait,
        :class:`ShuttingDownError` after :meth:`stop`."""
        with self._cond:
            if self._closed:
                raise ShuttingDownError("the server is shutting down")
            waiting = sum(not j.cancelled for j in self._pending)
            # An idle worker takes the next job at once: it does not count against the queue.
            if waiting >= self.max_queue + (self._running is None):
                raise QueueFullError(f"{waiting} requests are already waiting")
            self._pending.append(job)
            self._cond.notify()

    def cancel_all(self) -> None:
        """Cancel the running job and every queued one (they end with ShuttingDownError)."""
        with self._cond:
            for job in [*self._pending, *([self._running] if self._running else [])]:
                job.cancel(ShuttingDownError("the server is shutting down"))

    def fail_all(self, error: BaseException, timeout: float = 3.0) -> None:
        """The engine is lost: refuse new jobs, end the running job and every queued one with
        ``error``, and wait up to ``timeout`` seconds for their readers to take it. Safe from any
        thread, the worker's own included while it is stuck inside the engine."""
        with self._cond:
            self._closed = True
            jobs = [*([self._running] if self._running else []), *self._pending]
            self._pending.clear()
        readers = [job for job in jobs if not job.cancelled]  # the others have nobody waiting
        for job in jobs:
            job.fail(error)
        deadline = time.monotonic() + timeout
        for job in readers:
            job._error_read.wait(max(0.0, deadline - time.monotonic()))
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))  # the answers go out

    def stop(self, timeout: float | None = 30.0) -> None:
        """Refuse new jobs, cancel the rest and wait for the thread to finish."""
        with self._cond:
            self._closed = True
            self.cancel_all()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                job = self._running = self._pending.popleft()
            start = time.monotonic()
            try:
                stats = job._run()
                if self._on_done is not None:
                    self._on_done(job, stats, time.monotonic() - start)
            except Exception:  # never let a bug kill the only worker
                log.exception("worker error")
            finally:
                with self._cond:
                    self._running = None
