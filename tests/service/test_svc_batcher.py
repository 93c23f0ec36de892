"""The micro-batcher alone: batch/unbatch, coalescing, bounded queue, drain on close."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from scehr.service.batcher import (
    MicroBatcher,
    ModelInputs,
    ModelOutputs,
    Overloaded,
    batch,
    length_groups,
    run_chunked,
    unbatch,
)

pytestmark = pytest.mark.anyio


def fake_model(calls: list[int], delay: float = 0.0):
    """Masked mean over valid steps; records the rows of every run."""
    def run(inp: ModelInputs) -> ModelOutputs:
        calls.append(inp.rows)
        if delay:
            time.sleep(delay)
        valid = np.arange(inp.x.shape[1])[None, :] < inp.lengths[:, None]
        z = (inp.x * valid[..., None]).sum(1) / np.maximum(inp.lengths, 1)[:, None]
        return ModelOutputs(z, np.stack([z[:, :1], -z[:, :1]], -1), z[:, :1])
    return run


def gated(run, gate: threading.Event):
    """`run` once `gate` is set (5 s at most): a batch that computes until the test says."""
    def wait_then_run(inp: ModelInputs) -> ModelOutputs:
        gate.wait(5)
        return run(inp)
    return wait_then_run


def item(t: int, seed: int, rows: int = 1) -> ModelInputs:
    rng = np.random.default_rng(seed)
    return ModelInputs(rng.normal(size=(rows, t, 3)).astype(np.float32),
                       np.full(rows, t, dtype=np.int64))


def test_batch_pads_to_longest_and_unbatch_splits() -> None:
    a, b = item(3, 0), item(5, 1, rows=2)
    joined = batch([a, b])
    assert joined.x.shape == (3, 5, 3)
    assert (joined.x[0, 3:] == 0).all() and joined.lengths.tolist() == [3, 5, 5]
    out = fake_model([])(joined)
    parts = unbatch(out, [1, 2])
    assert [p.z.shape[0] for p in parts] == [1, 2]
    np.testing.assert_array_equal(parts[0].z, fake_model([])(a).z)


def test_run_chunked_respects_max_rows() -> None:
    calls: list[int] = []
    out = run_chunked(fake_model(calls), item(4, 0, rows=10), 4)
    assert calls == [4, 4, 2] and out.z.shape == (10, 3)


async def test_concurrent_submits_coalesce_and_match_unbatched() -> None:
    calls: list[int] = []
    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(fake_model(calls), max_batch_size=16, max_queue_delay=0.05,
                         max_queue_size=64, executor=ex)
        b.start()
        items = [item(2 + i % 4, i) for i in range(8)]
        outs = await asyncio.gather(*(b.submit(i) for i in items))
        await b.close()
    assert max(calls) > 1, calls  # at least one real batch
    ref = fake_model([])
    for i, o in zip(items, outs, strict=True):
        np.testing.assert_array_equal(o.z, ref(i).z)


def test_length_groups_keep_equal_lengths_together_and_split_far_ones() -> None:
    assert length_groups([48] * 20, [1] * 20) == [list(range(20))]  # fixed window: one run
    groups = length_groups([300, 10, 12, 290, 11], [1] * 5)
    assert groups == [[1, 4, 2], [3, 0]]
    assert sorted(i for g in groups for i in g) == list(range(5))
    # a group's padded size stays within the slack of its real size
    for g in length_groups([5, 6, 7, 9, 12, 15, 20, 26, 33, 41], [1, 3, 1, 2, 1, 1, 4, 1, 1, 2]):
        t = [[5, 6, 7, 9, 12, 15, 20, 26, 33, 41][i] for i in g]
        r = [[1, 3, 1, 2, 1, 1, 4, 1, 1, 2][i] for i in g]
        assert sum(r) * max(t) <= 1.25 * sum(a * b for a, b in zip(t, r, strict=True)) + 1e-9


async def test_mixed_lengths_run_in_groups_and_answer_each_caller() -> None:
    calls: list[int] = []
    gate = threading.Event()
    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(gated(fake_model(calls), gate), max_batch_size=32, max_queue_delay=0,
                         max_queue_size=64, executor=ex)
        b.start()
        first = asyncio.ensure_future(b.submit(item(3, 99)))
        await asyncio.sleep(0.05)  # computing: the others queue up behind it
        items = [item(t, i) for i, t in enumerate([40, 3, 41, 4, 3, 42])]
        rest = [asyncio.ensure_future(b.submit(i)) for i in items]
        await asyncio.sleep(0.05)
        gate.set()
        await first
        outs = await asyncio.gather(*rest)
        await b.close()
    assert calls == [1, 3, 3], calls  # the short three, then the long three: two runs
    for i, o in zip(items, outs, strict=True):
        np.testing.assert_allclose(o.z, fake_model([])(i).z, rtol=1e-6)


async def test_max_batch_size_one_never_batches() -> None:
    calls: list[int] = []
    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(fake_model(calls), max_batch_size=1, max_queue_delay=0.01,
                         max_queue_size=64, executor=ex)
        b.start()
        await asyncio.gather(*(b.submit(item(3, i)) for i in range(5)))
        await b.close()
    assert calls == [1] * 5


async def test_full_queue_raises_overloaded() -> None:
    gate = threading.Event()
    calls: list[int] = []

    def slow(inp: ModelInputs) -> ModelOutputs:
        gate.wait(5)
        return fake_model(calls)(inp)

    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(slow, max_batch_size=1, max_queue_delay=0, max_queue_size=2,
                         executor=ex)
        b.start()
        first = asyncio.ensure_future(b.submit(item(2, 0)))
        await asyncio.sleep(0.05)  # the first is computing, the queue is empty
        queued = [asyncio.ensure_future(b.submit(item(2, i))) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):
            await b.submit(item(2, 3))
        gate.set()
        await asyncio.gather(first, *queued)
        await b.close()


async def test_close_drains_queue_then_runs_stragglers_directly() -> None:
    calls: list[int] = []
    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(fake_model(calls, delay=0.02), max_batch_size=4, max_queue_delay=0.2,
                         max_queue_size=8, executor=ex)
        b.start()
        pending = [asyncio.ensure_future(b.submit(item(2, i))) for i in range(3)]
        await asyncio.sleep(0)
        await b.close()
        assert all(p.done() for p in pending)
        late = await b.submit(item(2, 9))  # after close: still answered, unbatched
        assert late.z.shape == (1, 3)


async def test_model_error_reaches_every_caller() -> None:
    def broken(inp: ModelInputs) -> ModelOutputs:
        raise RuntimeError("boom")

    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(broken, max_batch_size=8, max_queue_delay=0.02, max_queue_size=8,
                         executor=ex)
        b.start()
        res = await asyncio.gather(*(b.submit(item(2, i)) for i in range(3)),
                                   return_exceptions=True)
        await b.close()
    assert all(isinstance(r, RuntimeError) for r in res)


def threaded_model(threads: list[int]):
    """fake_model that records the thread of every run."""
    inner = fake_model([])

    def run(inp: ModelInputs) -> ModelOutputs:
        threads.append(threading.get_ident())
        return inner(inp)
    return run


@pytest.mark.parametrize(("inline", "alone", "on_caller"), [
    (True, True, True), (True, False, False), (False, True, False)])
async def test_a_lone_row_runs_on_the_caller_only_when_allowed_and_alone(
        inline: bool, alone: bool, on_caller: bool) -> None:
    threads: list[int] = []
    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(threaded_model(threads), max_batch_size=8, max_queue_delay=0,
                         max_queue_size=8, executor=ex, inline_when_idle=inline)
        b.start()
        out = await b.submit(item(3, 0), alone=lambda: alone)
        await b.close()
    np.testing.assert_array_equal(out.z, fake_model([])(item(3, 0)).z)
    assert (threads == [threading.get_ident()]) is on_caller, threads


@pytest.mark.parametrize(("rows", "on_caller"), [(8, True), (9, False)])
async def test_a_lone_request_of_up_to_one_run_of_rows_runs_on_the_caller(
        rows: int, on_caller: bool) -> None:
    """A stay with its occlusion rows (explain=top) is one request of many rows: alone on an
    idle model it skips the hand-off to the worker thread too, up to one run's rows
    (max_batch_size); a bigger request, which needs several runs, goes to the worker."""
    threads: list[int] = []
    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(threaded_model(threads), max_batch_size=8, max_queue_delay=0,
                         max_queue_size=8, executor=ex, inline_when_idle=True)
        b.start()
        out = await b.submit(item(3, 0, rows=rows), alone=lambda: True)
        await b.close()
    np.testing.assert_array_equal(out.z, fake_model([])(item(3, 0, rows=rows)).z)
    assert (threading.get_ident() in threads) is on_caller, threads


async def test_a_busy_batcher_queues_even_a_lone_row() -> None:
    """While a batch computes, a row that says it is alone still waits for the model's
    worker thread: it never runs beside the batch on the event loop's thread."""
    gate = threading.Event()
    threads: list[int] = []
    with ThreadPoolExecutor(1) as ex:
        b = MicroBatcher(gated(threaded_model(threads), gate), max_batch_size=8,
                         max_queue_delay=0, max_queue_size=8, executor=ex,
                         inline_when_idle=True)
        b.start()
        first = asyncio.ensure_future(b.submit(item(2, 0)))  # no `alone`: queued
        await asyncio.sleep(0.05)  # the first is computing
        second = asyncio.ensure_future(b.submit(item(2, 1), alone=lambda: True))
        await asyncio.sleep(0.05)
        assert not second.done()
        gate.set()
        await asyncio.gather(first, second)
        await b.close()
    assert threading.get_ident() not in threads and len(threads) == 2
