"""The server's worker: one thread, jobs in arrival order, a bounded queue, prompt cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from edgespec.core.stats import Stats
from edgespec.errors import ConfigError
from edgespec.runtime.engine import Chunk
from edgespec.server.worker import (
    InternalError,
    Job,
    Piece,
    QueueFullError,
    ShuttingDownError,
    Worker,
)


class Script:
    """A stand-in for ``engine.stream``: yields ``n`` chunks, records what happened, and can be
    held at its first chunk by a gate, or fail."""

    def __init__(self, log: list, name: str, n: int = 3, *, gate: threading.Event | None = None,
                 error: Exception | None = None, delay: float = 0.0) -> None:
        self.log, self.name, self.n, self.gate, self.error = log, name, n, gate, error
        self.delay = delay
        self.closed = threading.Event()

    def __call__(self):
        self.log.append(("start", self.name, threading.current_thread().name))
        stats = Stats(prompt_tokens=2)
        try:
            for i in range(self.n):
                if self.gate is not None:
                    assert self.gate.wait(10)
                if self.error is not None:
                    raise self.error
                time.sleep(self.delay)
                stats.generated += 1
                yield Chunk(f"{self.name}{i} ", [], stats, "length" if i == self.n - 1 else None)
        finally:
            self.log.append(("end", self.name))
            self.closed.set()


async def drain(job: Job) -> str:
    text = ""
    while (piece := await job.next()) is not None:
        text += piece.text
    return text


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_jobs_run_one_at_a_time_in_arrival_order_on_one_thread():
    async def main():
        log: list = []
        worker = Worker(max_queue=10)
        jobs = [Job(Script(log, name)) for name in "abcde"]
        for job in jobs:
            worker.submit(job)
        worker.start()
        texts = await asyncio.gather(*(drain(job) for job in jobs))
        worker.stop()
        return log, texts

    log, texts = run(main())
    assert texts == [f"{n}0 {n}1 {n}2 " for n in "abcde"]
    assert [e[:2] for e in log] == [(k, n) for n in "abcde" for k in ("start", "end")]
    assert {e[2] for e in log if e[0] == "start"} == {"edgespec-worker"}


def test_last_piece_carries_finish_reason_and_a_stats_snapshot():
    async def main():
        worker = Worker(max_queue=1)
        worker.start()
        job = Job(Script([], "x", n=2))
        worker.submit(job)
        pieces = [await job.next(), await job.next(), await job.next()]
        worker.stop()
        return pieces

    first, last, end = run(main())
    assert first == Piece("x0 ") and end is None
    assert last.finish_reason == "length" and last.stats["generated"] == 2


def test_a_job_of_several_choices_runs_them_in_turn_with_their_detail():
    async def main():
        log: list = []
        done: list = []
        worker = Worker(max_queue=1, on_done=lambda job, stats, secs: done.append((job.outcome, stats)))
        worker.start()
        job = Job(Script(log, "a", n=2), Script(log, "b", n=1),
                  detail=lambda chunk: (threading.current_thread().name, chunk.text))
        worker.submit(job)
        pieces = []
        while (piece := await job.next()) is not None:
            pieces.append(piece)
        worker.stop()
        return log, pieces, done

    log, pieces, done = run(main())
    assert [(p.choice, p.text, p.finish_reason) for p in pieces] == [
        (0, "a0 ", None), (0, "a1 ", "length"), (1, "b0 ", "length")]
    assert pieces[0].detail == ("edgespec-worker", "a0 ")  # made on the worker's thread
    assert [e[:2] for e in log] == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b")]
    [(outcome, stats)] = done
    assert outcome == "completed" and [s.generated for s in stats] == [2, 1]


def test_the_queue_is_bounded_and_cancelled_jobs_free_their_place():
    async def main():
        gate = threading.Event()
        log: list = []
        worker = Worker(max_queue=2)
        worker.start()
        running = Job(Script(log, "run", gate=gate))
        worker.submit(running)
        while not worker.busy:
            await asyncio.sleep(0.001)
        waiting = [Job(Script(log, f"w{i}")) for i in range(2)]
        for job in waiting:
            worker.submit(job)
        assert worker.queue_depth == 2
        with pytest.raises(QueueFullError):
            worker.submit(Job(Script(log, "refused")))
        waiting[0].cancel()  # its client went away: the place is free again
        assert worker.queue_depth == 1
        late = Job(Script(log, "late"))
        worker.submit(late)
        gate.set()
        results = await asyncio.gather(drain(running), drain(waiting[0]), drain(waiting[1]), drain(late))
        worker.stop()
        return log, results

    log, results = run(main())
    assert results[1] == ""  # cancelled while queued: never started
    assert [e[1] for e in log if e[0] == "start"] == ["run", "w1", "late"]


def test_cancelling_a_running_job_closes_its_generator_and_the_next_job_runs():
    async def main():
        gate = threading.Event()
        worker = Worker(max_queue=4)
        worker.start()
        long = Script([], "long", n=1000, gate=gate, delay=0.01)
        job = Job(long)
        worker.submit(job)
        after = Job(Script([], "after", n=2))
        worker.submit(after)
        gate.set()
        assert (await job.next()).text == "long0 "
        job.cancel()
        await asyncio.to_thread(long.closed.wait, 5)
        rest = await drain(job)
        text = await drain(after)
        worker.stop()
        return long, rest, text

    long, rest, text = run(main())
    assert long.closed.is_set()
    assert len(rest.split()) < 50  # stopped within a round or two, not after 1000 chunks
    assert text == "after0 after1 "


def test_errors_reach_the_request_and_the_worker_survives_them():
    async def main():
        worker = Worker(max_queue=4)
        worker.start()
        jobs = [Job(Script([], "bad", error=ConfigError("nope"))),
                Job(Script([], "bug", error=ZeroDivisionError())),
                Job(Script([], "ok", n=1))]
        for job in jobs:
            worker.submit(job)
        outcomes = []
        for job in jobs:
            try:
                outcomes.append(await drain(job))
            except Exception as err:  # noqa: BLE001
                outcomes.append(err)
        worker.stop()
        return outcomes, [job.outcome for job in jobs]

    (bad, bug, ok), states = run(main())
    assert isinstance(bad, ConfigError) and str(bad) == "nope"
    assert isinstance(bug, InternalError)
    assert ok == "ok0 "
    assert states == ["failed", "failed", "completed"]


def test_stop_cancels_running_and_queued_jobs_and_refuses_new_ones():
    async def main():
        gate = threading.Event()
        worker = Worker(max_queue=4)
        worker.start()
        running, queued = Job(Script([], "r", n=100, gate=gate)), Job(Script([], "q"))
        worker.submit(running)
        worker.submit(queued)
        while not worker.busy:
            await asyncio.sleep(0.001)
        stopping = asyncio.create_task(asyncio.to_thread(worker.stop))
        await asyncio.sleep(0.05)
        gate.set()
        await stopping
        errors = []
        for job in (running, queued):
            with pytest.raises(ShuttingDownError):
                await drain(job)
            errors.append(job.outcome)
        with pytest.raises(ShuttingDownError):
            worker.submit(Job(Script([], "new")))
        return errors

    start = time.monotonic()
    assert run(main()) == ["cancelled", "cancelled"]
    assert time.monotonic() - start < 5
