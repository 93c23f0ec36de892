"""Garbage-collector settings for a serving process: short pauses for the event loop.

A heavy request (a 256-stay batch with `explain=full`) holds millions of small objects while
it runs. With CPython's default thresholds (a young collection every 700 allocations) their
growth triggers full collections again and again, each walking every live object with the
GIL held: the event loop (and `/livez`) stalls that long. Collecting the young generation
every 100,000 allocations instead makes those full collections rare (and the request faster);
the cycles it leaves for longer are few, since the service's objects are mostly acyclic (freed
by reference counting at once). Objects alive at start-up (modules, the app) are frozen out of
every collection.

The GIL: while a worker thread runs Python (a heavy request's preparation and read-outs), the
event loop's thread takes the GIL back only after the interpreter's switch interval (5 ms by
default), and it needs it again after every `select()` of every loop iteration, several per
request: a `/livez` probe waits that many intervals. A shorter interval (`SCEHR_GIL_SWITCH_MS`,
1 ms by default) bounds each wait, at the cost of more thread switches while contended.

Set by the uvicorn factory (`build_app`) in each worker process, not by `create_app`, which
tests and embedders call in processes of their own.
"""

from __future__ import annotations

import gc
import sys

#: Allocations (less deallocations) between young-generation collections.
YOUNG_THRESHOLD = 100_000


def tune_collector() -> None:
    """Set the thresholds and freeze what exists now, garbage collected first (call once the
    app is set up)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    gc.collect()
    gc.freeze()


def share_gil(switch_ms: float) -> None:
    """The interpreter's switch interval: how long a thread waiting for the GIL (the event
    loop's) waits before the running one is asked to drop it."""
    sys.setswitchinterval(switch_ms / 1000)
