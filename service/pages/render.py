"""The pages' Jinja environment, their number formats and their security headers."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

HERE = Path(__file__).parent
STATIC = HERE / "static"

#: Everything from this service only: no inline script or style, no other origin, no frame.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def num(value: Any, digits: int = 3) -> str:
    """A figure at `digits` decimals; an em dash where there is none."""
    if value is None or isinstance(value, bool):
        return "—"
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "—" if not math.isfinite(x) else f"{x:.{digits}f}"


def pct(value: Any, digits: int = 1) -> str:
    """A share as a percentage."""
    if value is None:
        return "—"
    return f"{float(value) * 100:.{digits}f}%"


@cache
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = num
    env.filters["pct"] = pct
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def page(html: str, status: int = 200) -> HTMLResponse:
    """An HTML page with the pages' security headers."""
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
