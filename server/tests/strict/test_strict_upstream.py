"""The gateway in front of a strict third-party HTTP server (aiohttp): misses, hits and streams on the
three cacheable routes and a pass-through route, with no duplicate, hop-by-hop or credential header
reaching the upstream."""

import http.client
import json
import socket
import time
import urllib.parse
import urllib.request

import pytest

from conftest import ADMIN, CLIENT_ANTHROPIC_KEY, CLIENT_AZURE_KEY, CLIENT_KEY


def call(url: str, body=None, headers=None):
    """One request over a fresh connection (http.client sends `Connection` as given; urllib would not)."""
    parts = urllib.parse.urlsplit(url)
    sent = {
        "Authorization": f"Bearer {CLIENT_KEY}",
        "api-key": CLIENT_AZURE_KEY,
        "x-api-key": CLIENT_ANTHROPIC_KEY,
        # A header the client marks as for this hop only: a proxy must drop it.
        "Connection": "keep-alive, x-hop-secret",
        "x-hop-secret": "for the gateway only",
    }
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    sent.update(headers or {})
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request("POST" if data is not None else "GET", parts.path, body=data, headers=sent)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def upstream_stats(upstream: str) -> dict:
    with urllib.request.urlopen(f"{upstream}/_strict/stats", timeout=5) as r:
        return json.loads(r.read())


def admin_stats(gateway: str) -> dict:
    request = urllib.request.Request(f"{gateway}/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.loads(r.read())


def entries(gateway: str) -> int:
    return admin_stats(gateway)["store"]["entries"]


def wait_stored(gateway: str, at_least: int) -> None:
    """Answers are written off the request path: wait for the store to hold them."""
    deadline = time.time() + 10
    while entries(gateway) < at_least:
        assert time.time() < deadline, f"the store never reached {at_least} entries"
        time.sleep(0.02)


def sse_data(raw: bytes) -> list[str]:
    return [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]


def test_the_upstream_is_strict(upstream):
    """The fixture itself: a duplicate Content-Type is refused, as the gateway once sent it."""
    host, port = upstream.removeprefix("http://").split(":")
    body = b'{"model":"m","messages":[]}'
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(raw)
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.") and answer[8:13] == b" 400 ", answer[:200]


CASES = [
    ("/v1/chat/completions", {"model": "strict-model", "messages": [{"role": "user", "content": "strict chat"}]}),
    ("/v1/completions", {"model": "strict-model", "prompt": "strict completion"}),
    ("/v1/embeddings", {"model": "strict-embed", "input": "strict embedding"}),
]


@pytest.mark.parametrize("path,body", CASES, ids=[c[0] for c in CASES])
def test_miss_then_hit_on_cacheable_routes(gateway, upstream, path, body):
    before = upstream_stats(upstream)["counts"].get(path, 0)
    stored = entries(gateway)
    status, headers, first = call(gateway + path, body)
    assert status == 200, first
    assert headers.get("x-reprise-cache") == "miss"
    wait_stored(gateway, stored + 1)
    status, headers, second = call(gateway + path, body)
    assert status == 200, second
    assert headers.get("x-reprise-cache") == "hit"
    assert upstream_stats(upstream)["counts"].get(path, 0) == before + 1, "the hit stayed off the upstream"
    a, b = json.loads(first), json.loads(second)
    key = "data" if path.endswith("embeddings") else "choices"
    assert a[key] == b[key]


@pytest.mark.parametrize("path,body", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_streams_miss_then_hit(gateway, upstream, path, body):
    body = {**body, "stream": True}
    if "messages" in body:
        body["messages"] = [{"role": "user", "content": "strict chat, streamed"}]
    else:
        body["prompt"] = "strict completion, streamed"
    texts = []
    stored = entries(gateway)
    for expected in ("miss", "hit"):
        if expected == "hit":
            wait_stored(gateway, stored + 1)
        status, headers, raw = call(gateway + path, body)
        assert status == 200, raw
        assert headers.get("x-reprise-cache") == expected
        data = sse_data(raw)
        assert data[-1] == "[DONE]", raw
        chunks = [json.loads(d) for d in data[:-1]]
        texts.append("".join(c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or ""
                             for c in chunks if c.get("choices")))
    assert texts[0] and texts[0] == texts[1]


def test_pass_through_route(gateway):
    status, _, raw = call(gateway + "/v1/models")
    assert status == 200, raw
    assert json.loads(raw)["data"][0]["id"] == "strict-model"


def test_no_rule_was_broken(gateway, upstream):
    """Runs last: every request the gateway sent met the upstream's rules."""
    call(gateway + "/v1/models")
    stats = upstream_stats(upstream)
    assert stats["violations"] == [], stats["violations"]
    assert sum(stats["counts"].values()) >= 6
    errors = admin_stats(gateway)["upstream_errors"]
    assert errors["status"] == 0, errors
