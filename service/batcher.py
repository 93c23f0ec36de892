"""Dynamic micro-batching: concurrent requests for one model share one ONNX Runtime run.

LitServe-like: `batch` (concatenate the queued requests, padding to the longest T), the
blocking ORT calls on the executor's worker threads (off the event loop), `unbatch` (split the
outputs back by rows). The exception (`inline_when_idle`, on the CPU provider): a lone request
for an idle model, with nothing to batch with, runs at once on the calling thread, the event
loop's, sparing the hand-off to a worker thread and back.
Queued requests of very different lengths (whole-stay phenotype models) are run as a few
length groups (`length_groups`), so padding to the longest stay does not cancel the gain.
While a batch computes, the next one gathers in a bounded queue; a full queue refuses new work
(`Overloaded` -> 503 with Retry-After) instead of letting latency grow without bound. One batcher
per model and per worker process: batching never spans processes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("scehr.batcher")


@dataclass
class ModelInputs:
    """Rows for the graph: x [n, T, F] float32, lengths [n] int64, static [n, S] or None."""

    x: np.ndarray
    lengths: np.ndarray
    static: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return int(self.x.shape[0])


@dataclass
class ModelOutputs:
    """z [n, D], anchor_logits [n, C, 2], probability [n, C]; a landmark model's graph also
    gives them at every step (`scehr.schemas.contract.LANDMARK_OUTPUTS`, in that order):
    anchor_logits_by_hour [n, T, C, 2] and probability_by_hour [n, T, C]."""

    z: np.ndarray
    anchor_logits: np.ndarray
    probability: np.ndarray
    anchor_logits_by_hour: np.ndarray | None = None
    probability_by_hour: np.ndarray | None = None

    def take(self, start: int, stop: int) -> ModelOutputs:
        return ModelOutputs(*(None if a is None else a[start:stop] for a in self.arrays()))

    def arrays(self) -> tuple[np.ndarray | None, ...]:
        """Every output, in field order (None: not fetched)."""
        return (self.z, self.anchor_logits, self.probability, self.anchor_logits_by_hour,
                self.probability_by_hour)


def batch(items: list[ModelInputs]) -> ModelInputs:
    """Concatenate along rows, zero-padding every x to the longest T (lengths say what counts)."""
    if len(items) == 1:
        return items[0]
    t = max(i.x.shape[1] for i in items)
    n = sum(i.rows for i in items)
    x = np.zeros((n, t, items[0].x.shape[2]), dtype=np.float32)
    r = 0
    for i in items:
        x[r : r + i.rows, : i.x.shape[1]] = i.x
        r += i.rows
    lengths = np.concatenate([i.lengths for i in items])
    static = None if items[0].static is None else np.concatenate([i.static for i in items])
    return ModelInputs(x, lengths, static)


#: Padded time steps a length group may hold per real one: grouping stops adding longer stays
#: to a group once padding would exceed this share (1.25: at most a fifth of the work padding).
PADDING_SLACK = 1.25


def length_groups(lengths: list[int], rows: list[int],
                  slack: float = PADDING_SLACK) -> list[list[int]]:
    """Indices of queued requests, grouped by time length so that each ORT run pads little.

    Requests are sorted by length; a group takes the next (longer) one while its padded size
    (rows x the longest length) stays within `slack` x its real size. Equal lengths (every
    fixed-window model) always form one group, so batching is never split for nothing."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    real = n = 0
    for i in order:
        t, r = lengths[i], rows[i]
        if groups and (n + r) * t <= slack * (real + r * t):
            groups[-1].append(i)
            real, n = real + r * t, n + r
        else:
            groups.append([i])
            real, n = r * t, r
    return groups


def unbatch(out: ModelOutputs, sizes: list[int]) -> list[ModelOutputs]:
    bounds = np.cumsum([0, *sizes])
    return [out.take(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def concat_outputs(parts: list[ModelOutputs]) -> ModelOutputs:
    """The rows of `parts`, in order; per-step outputs padded to the longest run's steps
    (steps past a stay's length are undefined: readers ignore them)."""
    if len(parts) == 1:
        return parts[0]
    columns = zip(*(p.arrays() for p in parts), strict=True)
    return ModelOutputs(*(None if col[0] is None else _concat_steps(col) for col in columns))


def _concat_steps(arrays: tuple[np.ndarray, ...]) -> np.ndarray:
    """`np.concatenate` along rows, zero-padding axis 1 of per-step outputs to the longest."""
    if arrays[0].ndim > 2:
        t = max(a.shape[1] for a in arrays)
        arrays = tuple(np.pad(a, [(0, 0), (0, t - a.shape[1])] + [(0, 0)] * (a.ndim - 2))
                       for a in arrays)
    return np.concatenate(arrays)


def run_chunked(run: Callable[[ModelInputs], ModelOutputs], inputs: ModelInputs,
                max_rows: int) -> ModelOutputs:
    """One ORT call per `max_rows` rows, so a big batch request never exceeds the batch size."""
    if inputs.rows <= max_rows:
        return run(inputs)
    parts = []
    for a in range(0, inputs.rows, max_rows):
        s = slice(a, a + max_rows)
        parts.append(run(ModelInputs(inputs.x[s], inputs.lengths[s],
                                     None if inputs.static is None else inputs.static[s])))
    return concat_outputs(parts)


class Overloaded(Exception):
    """The queue is full: the caller should answer 503 with Retry-After."""


class DeadlineExceeded(Exception):
    """The request's deadline passed; `computing` says whether its batch had started (504)
    or it was still queued and never ran (503 with Retry-After)."""

    def __init__(self, computing: bool) -> None:
        super().__init__("computing" if computing else "queued")
        self.computing = computing


QueueObserver = Callable[[list[float]], None]  # seconds each request waited in the queue


@dataclass
class _Pending:
    inputs: ModelInputs
    future: asyncio.Future[ModelOutputs]
    enqueued: float
    deadline: float | None = None  # time.perf_counter() after which the caller gave up
    started: bool = False


class MicroBatcher:
    """Coalesce `submit` calls into batches of at most `max_batch_size` rows."""

    def __init__(self, run: Callable[[ModelInputs], ModelOutputs], *, max_batch_size: int,
                 max_queue_delay: float, max_queue_size: int, executor: Executor,
                 observe: QueueObserver | None = None, name: str = "",
                 inline_when_idle: bool = False) -> None:
        self._run = run
        self.inline_when_idle = inline_when_idle
        self._busy = False  # a batch is being gathered or computed
        self.max_batch_size = max_batch_size
        self.max_queue_delay = max_queue_delay
        self._executor = executor
        self._observe = observe
        self.name = name
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=max_queue_size)
        self._carry: deque[_Pending] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(),
                                                                name=f"batcher-{self.name}")

    @property
    def queued(self) -> int:
        return self._queue.qsize() + len(self._carry)

    @property
    def bound(self) -> int:
        return self._queue.maxsize

    async def submit(self, inputs: ModelInputs, deadline: float | None = None,
                     alone: Callable[[], bool] | None = None) -> ModelOutputs:
        """Queue the rows and wait for their outputs; raises `Overloaded` when the queue is full
        and `DeadlineExceeded` once `deadline` (a `time.perf_counter()` value) has passed.

        `alone()` True says no other request for this model is on its way (the load shedder's
        count): then, with `inline_when_idle`, the rows of an idle model (at most one run's
        worth, e.g. a stay and its occlusion rows) run at once on the calling thread."""
        loop = asyncio.get_running_loop()
        if self._closing or self._task is None:
            # A request that picked this model just before a reload swapped it out: run it on
            # this (old) session directly so it still finishes on the model it started with.
            return await loop.run_in_executor(self._executor, run_chunked, self._run, inputs,
                                              self.max_batch_size)
        if (self.inline_when_idle and inputs.rows <= self.max_batch_size
                and alone is not None):
            # One turn of the loop first: requests whose bytes have arrived get to be admitted
            # (a request is handled without a pause up to here, so none would be yet).
            await asyncio.sleep(0)
            if alone() and self._idle():
                # Nothing to batch with: run here, without the hand-off to a worker thread and
                # back, which costs about as much as a small graph's run on a CPU. The loop
                # waits at most one run of max_batch_size rows, and only when no other request
                # is admitted. Under load requests are admitted and queue as before.
                self._notify([0.0])
                return self._run(inputs)
        fut: asyncio.Future[ModelOutputs] = loop.create_future()
        pending = _Pending(inputs, fut, time.perf_counter(), deadline)
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            raise Overloaded(f"{self.name}: {self._queue.maxsize} requests queued") from None
        if deadline is None:
            return await fut
        try:
            return await asyncio.wait_for(asyncio.shield(fut),
                                          max(0.0, deadline - time.perf_counter()))
        except TimeoutError:
            if not pending.started:
                fut.cancel()  # the batcher skips it: no compute is spent on a caller gone
            raise DeadlineExceeded(pending.started) from None

    def _idle(self) -> bool:
        return not self._busy and not self._carry and self._queue.empty()

    async def close(self) -> None:
        """Finish everything queued, then stop (new submits run unbatched on this model)."""
        self._closing = True
        if self._task is not None:
            await self._queue.put(_Pending(ModelInputs(np.zeros((0, 0, 0)), np.zeros(0)),
                                           asyncio.get_running_loop().create_future(), 0.0))
            await self._task

    def _notify(self, waits: list[float]) -> None:
        if self._observe is not None:
            try:
                self._observe(waits)
            except Exception:  # metrics must never break inference
                log.exception("batch observer failed")

    async def _next(self, timeout: float | None) -> _Pending | None:
        if self._carry:
            return self._carry.popleft()
        if timeout is None:
            return await self._queue.get()
        if timeout <= 0:
            try:
                return self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return None
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    async def _gather(self) -> tuple[list[_Pending], bool]:
        """The next batch; `True` when the close sentinel was met."""
        first = await self._next(None)
        if first.inputs.rows == 0:
            return [], True
        self._busy = True  # until `_loop` has answered this batch
        items, rows = [first], first.inputs.rows
        deadline = time.perf_counter() + self.max_queue_delay
        while rows < self.max_batch_size:
            nxt = await self._next(deadline - time.perf_counter())
            if nxt is None:
                break
            if nxt.inputs.rows == 0:  # close sentinel: run what we have, then stop
                return items, True
            if rows + nxt.inputs.rows > self.max_batch_size:
                self._carry.appendleft(nxt)
                break
            items.append(nxt)
            rows += nxt.inputs.rows
        return items, False

    def _run_groups(self, groups: list[list[ModelInputs]]) -> list[ModelOutputs]:
        """One ORT run per length group (padding and copying in the worker thread too)."""
        return [run_chunked(self._run, batch(g), self.max_batch_size) for g in groups]

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        done = False
        while not done:
            self._busy = False
            items, done = await self._gather()
            now = time.perf_counter()
            for i in items:  # past their deadline already: answered, never computed
                if i.deadline is not None and now >= i.deadline and not i.future.done():
                    i.future.set_exception(DeadlineExceeded(False))
            items = [i for i in items if not i.future.done()]  # callers that went away
            if not items:
                continue
            for i in items:
                i.started = True
            start = time.perf_counter()
            self._notify([start - i.enqueued for i in items])
            groups = [[items[k] for k in g] for g in length_groups(
                [i.inputs.x.shape[1] for i in items], [i.inputs.rows for i in items])]
            try:
                outs = await loop.run_in_executor(self._executor, self._run_groups,
                                                  [[i.inputs for i in g] for g in groups])
            except Exception as e:  # the model failed: every caller in the batch learns it
                log.exception("inference failed", extra={"model": self.name,
                                                         "rows": sum(i.inputs.rows
                                                                     for i in items)})
                for i in items:
                    if not i.future.done():
                        i.future.set_exception(e)
                continue
            for g, out in zip(groups, outs, strict=True):
                for i, o in zip(g, unbatch(out, [i.inputs.rows for i in g]), strict=True):
                    if not i.future.done():
                        i.future.set_result(o)
        # Anything left behind the sentinel (a submit raced the close) runs now.
        while self._carry or not self._queue.empty():
            p = await self._next(0)
            if p is None or p.inputs.rows == 0:
                continue
            try:
                p.future.set_result(await loop.run_in_executor(
                    self._executor, run_chunked, self._run, p.inputs, self.max_batch_size))
            except Exception as e:
                p.future.set_exception(e)
