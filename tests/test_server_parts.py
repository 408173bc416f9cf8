"""forkv serve's parts without a server: tenants and namespaces, image decoding, and the
Prometheus text format."""

from __future__ import annotations

import base64
import io

import pytest

pytest.importorskip("starlette")

from forkv.server.auth import Tenants, namespace_of  # noqa: E402
from forkv.server.errors import APIError  # noqa: E402
from forkv.server.inputs import decode_image  # noqa: E402
from forkv.server.metrics import Metrics  # noqa: E402


def test_tenants_and_namespaces():
    open_server = Tenants()
    assert open_server.tenant(None) == "" and namespace_of("") == ""
    keyed = Tenants(["k1", "k2"])
    a, b = keyed.tenant("Bearer k1"), keyed.tenant("bearer k2")
    assert a != b and "k1" not in a
    for header in (None, "Bearer nope", "Basic k1", "Bearer"):
        with pytest.raises(APIError) as e:
            keyed.tenant(header)
        assert e.value.status == 401
    assert namespace_of(a, "s") != namespace_of(a, "t") != a
    assert namespace_of(a, "s") == namespace_of(a, "s")
    with pytest.raises(APIError):
        namespace_of(a, 7)


def test_decode_image():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "PNG")
    raw = buf.getvalue()
    b64 = base64.b64encode(raw).decode()
    assert decode_image(f"data:image/png;base64,{b64}", "p") == raw
    assert decode_image({"url": b64}, "p") == raw
    for bad, code in (("https://x/y.png", "invalid_image_url"),
                      ("data:image/png,abc", "invalid_image"), ("!!!", "invalid_image"),
                      (base64.b64encode(b"text").decode(), "invalid_image"),
                      (None, "invalid_image")):
        with pytest.raises(APIError) as e:
            decode_image(bad, "p")
        assert e.value.status == 400 and e.value.code == code


def test_metrics_text_format():
    m = Metrics()
    m.request("chat", 200)
    m.tokens(5)
    m.ttft(0.3)
    m.ttft(500.0)
    stats = {"tokens_reused": 256, "tokens_computed": 10, "hits": {"global": 2},
             "misses": {"global": 1}, "tier_bytes": {"ram": 100, "disk": 0}, "waiting": 0,
             "running": 1, "in_flight": 1, "namespaces": 1}
    lines = m.render(stats).splitlines()
    samples = dict(line.rsplit(" ", 1) for line in lines if not line.startswith("#"))
    assert all(name.startswith("forkv_") for name in samples)
    assert samples['forkv_requests_total{endpoint="chat",status="200"}'] == "1"
    assert samples["forkv_tokens_generated_total"] == "5"
    assert samples['forkv_record_hits_total{kind="global"}'] == "2"
    assert samples['forkv_time_to_first_token_seconds_bucket{le="0.5"}'] == "1"
    assert samples['forkv_time_to_first_token_seconds_bucket{le="+Inf"}'] == "2"
    assert samples["forkv_time_to_first_token_seconds_count"] == "2"
