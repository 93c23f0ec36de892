"""/docs and /redoc work on a network without internet: every asset comes from the service."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from scehr.service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio

#: src/href attributes and url() references; the OpenAPI document is the only JSON fetched
ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\s*:\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_load_nothing_from_other_hosts(
        make_settings: Callable[..., Settings], page: str) -> None:
    async with serve(make_settings()) as client:
        html = (await client.get(page)).text
        assert "//" not in re.sub(r"<!--.*?-->", "", html).replace("http://test", ""), \
            "a URL with a host in the page"
        if page == "/docs":
            assert '"validatorUrl": null' in html
        assets = [a or b for a, b in ASSET.findall(html)]
        assert any(a.endswith(".js") for a in assets)
        for url in assets:
            assert url.startswith("/"), url
            r = await client.get(url)
            assert r.status_code == 200 and len(r.content) > 100, url
