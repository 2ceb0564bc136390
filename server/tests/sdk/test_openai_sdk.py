"""The official OpenAI Python SDK works through the gateway with only base_url changed."""

import json

import openai
import pytest
from openai import OpenAI


def clients(sim_url, gateway_url):
    direct = OpenAI(base_url=sim_url, api_key="sk-test", max_retries=0)
    via = OpenAI(base_url=gateway_url, api_key="sk-test", max_retries=0)
    return direct, via


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What does a prompt cache do?"},
]


def test_non_streaming_chat_matches_direct(sim_url, gateway_url):
    direct, via = clients(sim_url, gateway_url)
    a = direct.chat.completions.create(model="sim-model", messages=MESSAGES)
    b = via.chat.completions.create(model="sim-model", messages=MESSAGES)
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.choices[0].finish_reason == "stop"
    assert b.usage.completion_tokens == a.usage.completion_tokens


def test_streaming_chat_matches_direct(sim_url, gateway_url):
    direct, via = clients(sim_url, gateway_url)

    def collect(client):
        parts, finish = [], None
        stream = client.chat.completions.create(model="sim-model", messages=MESSAGES, stream=True)
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    parts.append(choice.delta.content)
                finish = choice.finish_reason or finish
        return "".join(parts), finish

    assert collect(via) == collect(direct)
    assert collect(via)[1] == "stop"


def test_stream_usage_and_raw_headers(gateway_url):
    via = OpenAI(base_url=gateway_url, api_key="sk-test", max_retries=0)
    usage = None
    for chunk in via.chat.completions.create(
        model="sim-model", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ):
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 12

    raw = via.chat.completions.with_raw_response.create(model="sim-model", messages=MESSAGES)
    timing = raw.headers.get("server-timing")
    assert timing and "ttft;dur=" in timing
    assert raw.headers.get("x-reprise-request-id", "").startswith("req_")
    assert raw.parse().choices[0].message.content


def test_completions_embeddings_and_models(sim_url, gateway_url):
    direct, via = clients(sim_url, gateway_url)
    a = direct.completions.create(model="sim-model", prompt="Say something")
    b = via.completions.create(model="sim-model", prompt="Say something")
    assert b.choices[0].text == a.choices[0].text
    # The SDK asks for base64 embeddings by default and decodes them.
    ea = direct.embeddings.create(model="sim-embedding", input=["one", "two"])
    eb = via.embeddings.create(model="sim-embedding", input=["one", "two"])
    assert [d.embedding for d in eb.data] == [d.embedding for d in ea.data]
    assert {m.id for m in via.models.list()} >= {"sim-model"}


def fresh_messages(tag):
    """Messages no other test sends, so a cached answer cannot stand in for an injected fault."""
    return [{"role": "user", "content": f"fault test {tag}"}]


def test_upstream_and_gateway_errors_raise_the_sdk_exceptions(gateway_url):
    via = OpenAI(base_url=gateway_url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        via.chat.completions.create(
            model="sim-model", messages=fresh_messages("429"), extra_headers={"x-sim-fault": "status=429"}
        )
    with pytest.raises(openai.BadRequestError) as bad:
        via.chat.completions.create(model="sim-model", messages="not a list")
    assert bad.value.body["param"] == "messages"
    # A stream that breaks mid-way surfaces as an APIError while iterating, not a silent end.
    with pytest.raises(openai.APIError):
        for _ in via.chat.completions.create(
            model="sim-model", messages=fresh_messages("cut"), stream=True, extra_headers={"x-sim-fault": "cut=3"}
        ):
            pass
    # Neither failure was cached: the same requests now reach the upstream and succeed.
    ok = via.chat.completions.with_raw_response.create(model="sim-model", messages=fresh_messages("cut"))
    assert ok.headers["x-reprise-cache"] == "miss"


def test_admin_requests_lists_sdk_calls(gateway_url):
    import urllib.request

    base = gateway_url.removesuffix("/v1")
    req = urllib.request.Request(base + "/admin/requests?limit=5", headers={"Authorization": "Bearer sdk-admin"})
    with urllib.request.urlopen(req) as r:
        records = json.load(r)["data"]
    assert records and all("phases" in r for r in records)


def test_repeated_requests_are_served_from_the_cache(gateway_url):
    via = OpenAI(base_url=gateway_url, api_key="sk-cache-test", max_retries=0)
    messages = [{"role": "user", "content": "Cache me through the SDK"}]
    first = via.chat.completions.with_raw_response.create(model="sim-model", messages=messages)
    assert first.headers["x-reprise-cache"] == "miss"
    text = first.parse().choices[0].message.content
    import time

    for _ in range(50):
        second = via.chat.completions.with_raw_response.create(model="sim-model", messages=messages)
        if second.headers["x-reprise-cache"] == "hit":
            break
        time.sleep(0.02)
    assert second.headers["x-reprise-cache"] == "hit"
    assert second.headers["x-reprise-entry"].startswith("e_")
    assert second.parse().choices[0].message.content == text
    # The streamed form of the same request is a hit too, and the SDK assembles the same text.
    stream = via.chat.completions.create(model="sim-model", messages=messages, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    # Another API key is another tenant: a miss.
    other = OpenAI(base_url=gateway_url, api_key="sk-other-tenant", max_retries=0)
    raw = other.chat.completions.with_raw_response.create(model="sim-model", messages=messages)
    assert raw.headers["x-reprise-cache"] == "miss"
