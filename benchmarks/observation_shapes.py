"""What a long-form stay's observations cost as pydantic models: real set-C stays (LOINC-coded,
`payloads.default_model_stays`) validated from JSON as `list[Observation]` (the contract's
models, as `StayPayload` reads them) and as the same fields into plain dicts (a TypedDict built
from `Observation`'s own fields and config, so the same rules), each list then freed.

    .venv/bin/python benchmarks/observation_shapes.py [--stays 200] [--passes 5]

The two alternate per pass; the values must be equal. Best pass of each, CPU ms per stay
(`time.thread_time`), with the load average. Only prints.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from typing import Annotated, Any, NotRequired

from common import REPO, dumps
from payloads import default_model_stays
from pydantic import TypeAdapter
from typing_extensions import TypedDict  # pydantic reads this one's config before Python 3.12

from scehr.schemas.payloads import Observation


def as_typed_dict() -> Any:
    """`Observation`'s fields (annotations, constraints, validators) as a TypedDict."""
    fields: dict[str, Any] = {}
    for name, f in Observation.model_fields.items():
        kind = Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
        fields[name] = kind if f.is_required() else NotRequired[kind]
    td = TypedDict("ObservationFields", fields)  # type: ignore[operator]
    td.__pydantic_config__ = Observation.model_config  # type: ignore[attr-defined]
    return td


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stays", type=int, default=200)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    stays, about = default_model_stays("mortality", args.stays, REPO / "models", form="loinc")
    bodies = [dumps(s["observations"]) for s in stays]
    shapes = {"models": TypeAdapter(list[Observation]), "dicts": TypeAdapter(list[as_typed_dict()])}
    for b in bodies:
        models, dicts = (ta.validate_json(b) for ta in shapes.values())
        assert all({k: v for k, v in vars(m).items() if k in d or v is not None} == d
                   for m, d in zip(models, dicts, strict=True)), "the shapes read different values"
    gc.collect()
    load = os.getloadavg()
    best = dict.fromkeys(shapes, float("inf"))
    for p in range(args.passes):
        for name in (list(shapes) if p % 2 else list(shapes)[::-1]):
            t0 = time.thread_time()
            for b in bodies:
                read = shapes[name].validate_json(b)
                del read
            best[name] = min(best[name], (time.thread_time() - t0) / len(bodies) * 1e3)
    n = sum(len(s["observations"]) for s in stays) / len(stays)
    print(f"{about}; {n:.0f} observations per stay on average; load average {load} before, "
          f"{os.getloadavg()} after")
    print("| observations as | parse + free, CPU ms per stay |")
    print("|---|---|")
    for name, ms in best.items():
        print(f"| {name} | {ms:.3f} |")
    print(f"models - dicts: {best['models'] - best['dicts']:.3f} ms per stay")


if __name__ == "__main__":
    main()
