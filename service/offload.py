"""Where a request's CPU work runs: on the event loop's thread when light, in a worker thread
when heavy, so the loop stays free (/livez, other requests' I/O) whatever a request costs.

One rule (`heavy`) for every interface, by what the work costs; the endpoint factory
(`scehr.service.interfaces.endpoint`) applies it, and the scorer follows its answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from scehr.service.explain import LEVELS

T = TypeVar("T")


def heavy(explain: str, body_cost: float, offload_bytes: int, stays: int = 1) -> bool:
    """Whether a request's work goes to a worker thread: when its answer lists every
    channel's contribution of every class (`explain=full`: the answer grows with channels x
    classes; `top` adds the same occlusion rows, which ORT runs, and three contributions a
    class), when it carries more than one stay (or tensor row), or when decoding its body
    costs more than decoding `offload_bytes` (SCEHR_OFFLOAD_BYTES) of JSON stays does
    (`body_cost`: its size times the codec's `byte_cost`). Before decoding, `stays` is 1: the
    rule is applied again once the count is known."""
    return LEVELS[explain].every_channel or stays > 1 or body_cost > offload_bytes


async def in_worker(heavy: bool, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """CPU work of a request: in a worker thread when heavy, so the event loop stays free;
    inline when light, where the hop would cost more."""
    if heavy:
        return await run_in_threadpool(fn, *args, **kw)
    return fn(*args, **kw)


def release(*heaps: list[Any]) -> None:
    """Empty a request's large lists one element at a time (call it in a worker thread, once
    the answer is built). Dropped at once, as a route's locals are when it returns, on the
    event loop's thread, 256 stays' payloads and predictions (~10^6 objects) are freed in one
    C call that holds the GIL throughout: `/livez` stalls that long. One element at a time,
    the freeing is many short steps between which the loop's thread takes the GIL."""
    for heap in heaps:
        while heap:
            heap.pop()


async def released(heavy: bool, *heaps: list[Any]) -> None:
    """`release` in a worker thread when the request was heavy (else freeing is short)."""
    if heavy:
        await run_in_threadpool(release, *heaps)
