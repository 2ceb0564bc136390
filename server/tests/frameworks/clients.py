"""The ways an application asks the gateway a question, one adapter per client library and calling style, each
reading the cache outcome (`x-reprise-cache`) the way a user of that library would. The scenarios in
test_cache.py run against every adapter in CLIENTS, chat completions, the Responses API and Anthropic's Messages
API alike; a new client or route is one more adapter here.

An adapter is `ask(stack, key, prompt, stream) -> Reply`: one question under API key `key`, streamed or not."""

import asyncio
import functools
from dataclasses import dataclass
from typing import Callable

import anthropic
import openai
from openai import AsyncOpenAI, OpenAI

MODEL = "sim-model"
SYSTEM = "You answer in one short sentence."


@dataclass
class Reply:
    outcome: str | None  # the response's x-reprise-cache header
    text: str
    request_id: str | None  # x-reprise-request-id: the gateway's record of this request in /admin/requests


def reply(headers, text: str) -> Reply:
    """A Reply from the response headers (any mapping with `get`) and the text the client assembled."""
    return Reply(headers.get("x-reprise-cache"), text, headers.get("x-reprise-request-id"))


@dataclass
class Client:
    name: str
    ask: Callable[..., Reply]


# One event loop for every async adapter, as in an application: LangChain keeps its default async HTTP client
# across calls, and a client must not outlive the loop its connections belong to.
LOOP = asyncio.new_event_loop()


def run_async(coro):
    return LOOP.run_until_complete(coro)


def messages(prompt: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


class Outcomes:
    """Records the headers of every response an httpx client receives, through its event hooks: the way to read
    `x-reprise-cache` when the library keeps the HTTP response to itself (the SDK's streaming helpers, the Agents
    SDK). Hooks run when the headers arrive, before the body is read."""

    def __init__(self):
        self.seen: list[tuple[str, object]] = []

    def _record(self, response) -> None:
        self.seen.append((response.request.url.path, response.headers))

    async def _arecord(self, response) -> None:
        self._record(response)

    def http_client(self):
        return openai.DefaultHttpxClient(event_hooks={"response": [self._record]})

    def async_http_client(self):
        return openai.DefaultAsyncHttpxClient(event_hooks={"response": [self._arecord]})

    def one(self):
        """The headers of the only response since the last call; fails when there was not exactly one request."""
        seen, self.seen = self.seen, []
        assert len(seen) == 1, f"expected one request to the gateway, saw {seen}"
        return seen[0][1]


# ---- the official OpenAI Python SDK: create with `with_raw_response` (the headers are on the raw response) ----

def openai_sync(stack, key, prompt, stream) -> Reply:
    with OpenAI(base_url=stack.base_url, api_key=key, max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages(prompt), stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        else:
            text = raw.parse().choices[0].message.content
        return reply(raw.headers, text)


def openai_async(stack, key, prompt, stream) -> Reply:
    async def run():
        async with AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages(prompt), stream=stream
            )
            # with_raw_response gives the SDK's legacy response, whose parse() is synchronous even here.
            if stream:
                text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
            else:
                text = raw.parse().choices[0].message.content
            return reply(raw.headers, text)

    return run_async(run())


# ---- the SDK's helpers: `chat.completions.stream(...)` (events, final completion) and `chat.completions.parse` ----

def openai_helpers_sync(stack, key, prompt, stream) -> Reply:
    seen = Outcomes()
    with OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, http_client=seen.http_client()) as client:
        if stream:
            with client.chat.completions.stream(model=MODEL, messages=messages(prompt)) as events:
                deltas = "".join(e.delta for e in events if e.type == "content.delta")
                final = events.get_final_completion().choices[0].message.content
            assert deltas == final, "the helper's events and its final completion disagree"
            return reply(seen.one(), final)
        raw = client.chat.completions.with_raw_response.parse(model=MODEL, messages=messages(prompt))
        assert seen.one() == raw.headers
        return reply(raw.headers, raw.parse().choices[0].message.content)


def openai_helpers_async(stack, key, prompt, stream) -> Reply:
    async def run():
        seen = Outcomes()
        async with AsyncOpenAI(
            base_url=stack.base_url, api_key=key, max_retries=0, http_client=seen.async_http_client()
        ) as client:
            if stream:
                async with client.chat.completions.stream(model=MODEL, messages=messages(prompt)) as events:
                    deltas = "".join([e.delta async for e in events if e.type == "content.delta"])
                    final = (await events.get_final_completion()).choices[0].message.content
                assert deltas == final, "the helper's events and its final completion disagree"
                return reply(seen.one(), final)
            parsed = await client.chat.completions.parse(model=MODEL, messages=messages(prompt))
            return reply(seen.one(), parsed.choices[0].message.content)

    return run_async(run())


# ---- LangChain's ChatOpenAI: `include_response_headers=True` puts the headers in `response_metadata` ----

def chat_openai(stack, key):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=stack.base_url, api_key=key, max_retries=0, include_response_headers=True)


def lc_messages(prompt):
    return [("system", SYSTEM), ("human", prompt)]


def langchain_sync(stack, key, prompt, stream) -> Reply:
    llm = chat_openai(stack, key)
    if stream:
        chunks = list(llm.stream(lc_messages(prompt)))
        # The headers ride on the first chunk's metadata.
        return reply(chunks[0].response_metadata["headers"], "".join(c.content for c in chunks))
    message = llm.invoke(lc_messages(prompt))
    return reply(message.response_metadata["headers"], message.content)


def langchain_async(stack, key, prompt, stream) -> Reply:
    async def run():
        llm = chat_openai(stack, key)
        if stream:
            chunks = [c async for c in llm.astream(lc_messages(prompt))]
            return reply(chunks[0].response_metadata["headers"], "".join(c.content for c in chunks))
        message = await llm.ainvoke(lc_messages(prompt))
        return reply(message.response_metadata["headers"], message.content)

    return run_async(run())


# ---- the OpenAI Agents SDK: a one-turn agent on a model class given by name, tracing off ----

def lookup_order(order_id: str) -> str:
    """Looks up an order by its id."""
    return f"order {order_id}: shipped"


def agents_run(stack, key, prompt, stream, model_class="OpenAIChatCompletionsModel", with_tool=False) -> Reply:
    import agents
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import MessageOutputItem

    # The SDK's trace exporter posts to OpenAI directly, not through the gateway; a gateway user turns it off or
    # sends traces elsewhere.
    set_tracing_disabled(True)
    model = getattr(agents, model_class)

    async def run():
        seen = Outcomes()
        async with AsyncOpenAI(
            base_url=stack.base_url, api_key=key, max_retries=0, http_client=seen.async_http_client()
        ) as client:
            return await one_turn(client, seen)

    async def one_turn(client, seen):
        agent = Agent(
            name="assistant", instructions=SYSTEM, model=model(model=MODEL, openai_client=client),
            # A tool the model may call (tool_choice auto): its schema joins the partition, and reprise-sim answers
            # in text, so the run still ends in one turn.
            tools=[function_tool(lookup_order)] if with_tool else [],
        )
        if stream:
            result = Runner.run_streamed(agent, prompt)
            deltas = []
            async for event in result.stream_events():
                if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    deltas.append(event.data.delta)
            assert "".join(deltas) == result.final_output, "streamed deltas and the final output disagree"
        else:
            result = await Runner.run(agent, prompt)
        # One turn: one model call, answered with plain text (reprise-sim calls a tool only when forced to).
        assert [type(i) for i in result.new_items] == [MessageOutputItem], result.new_items
        assert isinstance(result.final_output, str) and result.final_output
        return reply(seen.one(), result.final_output)

    return run_async(run())


# ---- the Responses API: `client.responses` (create with `with_raw_response`, and the `stream`/`parse` helpers) ----

def response_text(events) -> str:
    """The text of a Responses API stream: its `response.output_text.delta` events."""
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def responses_sync(stack, key, prompt, stream) -> Reply:
    with OpenAI(base_url=stack.base_url, api_key=key, max_retries=0) as client:
        raw = client.responses.with_raw_response.create(model=MODEL, instructions=SYSTEM, input=prompt, stream=stream)
        text = response_text(raw.parse()) if stream else raw.parse().output_text
        return reply(raw.headers, text)


def responses_async(stack, key, prompt, stream) -> Reply:
    async def run():
        async with AsyncOpenAI(base_url=stack.base_url, api_key=key, max_retries=0) as client:
            raw = await client.responses.with_raw_response.create(
                model=MODEL, instructions=SYSTEM, input=prompt, stream=stream
            )
            if stream:
                text = response_text([e async for e in raw.parse()])
            else:
                text = raw.parse().output_text
            return reply(raw.headers, text)

    return run_async(run())


def responses_helpers_sync(stack, key, prompt, stream) -> Reply:
    seen = Outcomes()
    with OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, http_client=seen.http_client()) as client:
        if stream:
            with client.responses.stream(model=MODEL, instructions=SYSTEM, input=prompt) as events:
                deltas = response_text(events)
                final = events.get_final_response().output_text
            assert deltas == final, "the helper's events and its final response disagree"
            return reply(seen.one(), final)
        parsed = client.responses.parse(model=MODEL, instructions=SYSTEM, input=prompt)
        return reply(seen.one(), parsed.output_text)


def responses_helpers_async(stack, key, prompt, stream) -> Reply:
    async def run():
        seen = Outcomes()
        async with AsyncOpenAI(
            base_url=stack.base_url, api_key=key, max_retries=0, http_client=seen.async_http_client()
        ) as client:
            if stream:
                async with client.responses.stream(model=MODEL, instructions=SYSTEM, input=prompt) as events:
                    deltas = response_text([e async for e in events])
                    final = (await events.get_final_response()).output_text
                assert deltas == final, "the helper's events and its final response disagree"
                return reply(seen.one(), final)
            parsed = await client.responses.parse(model=MODEL, instructions=SYSTEM, input=prompt)
            return reply(seen.one(), parsed.output_text)

    return run_async(run())


def lc_text(message) -> str:
    """A LangChain message's text: on the Responses API its content is a list of blocks."""
    return str(message.text)


def langchain_responses(stack, key, prompt, stream) -> Reply:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL, base_url=stack.base_url, api_key=key, max_retries=0, include_response_headers=True,
        use_responses_api=True,
    )
    if stream:
        chunks = list(llm.stream(lc_messages(prompt)))
        headers = next(c.response_metadata["headers"] for c in chunks if "headers" in c.response_metadata)
        return reply(headers, "".join(lc_text(c) for c in chunks))
    message = llm.invoke(lc_messages(prompt))
    return reply(message.response_metadata["headers"], lc_text(message))


# ---- Anthropic's Messages API: the official `anthropic` SDK and LangChain's ChatAnthropic ----
# Anthropic's clients take the gateway's address without `/v1`; they send `x-api-key` and `anthropic-version`.

CLAUDE_MODEL = "claude-sim"
MAX_TOKENS = 256


def claude_messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def claude_text(message) -> str:
    """The text of a `Message`: its text blocks (a thinking or tool_use block has none)."""
    return "".join(b.text for b in message.content if b.type == "text")


def claude_stream_text(events) -> str:
    """The text of a Messages stream: its `text_delta`s."""
    return "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )


class ClaudeOutcomes(Outcomes):
    """Outcomes for the anthropic SDK, whose HTTP client is its own (httpx2), with the same event hooks."""

    def http_client(self):
        return anthropic.DefaultHttpxClient(event_hooks={"response": [self._record]})

    def async_http_client(self):
        return anthropic.DefaultAsyncHttpxClient(event_hooks={"response": [self._arecord]})


def anthropic_sync(stack, key, prompt, stream) -> Reply:
    with anthropic.Anthropic(base_url=stack.url, api_key=key, max_retries=0) as client:
        raw = client.messages.with_raw_response.create(
            model=CLAUDE_MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=claude_messages(prompt), stream=stream
        )
        text = claude_stream_text(raw.parse()) if stream else claude_text(raw.parse())
        return reply(raw.headers, text)


def anthropic_async(stack, key, prompt, stream) -> Reply:
    async def run():
        async with anthropic.AsyncAnthropic(base_url=stack.url, api_key=key, max_retries=0) as client:
            raw = await client.messages.with_raw_response.create(
                model=CLAUDE_MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=claude_messages(prompt),
                stream=stream,
            )
            # Unlike the OpenAI SDK's, this raw response's parse() is a coroutine.
            parsed = await raw.parse()
            text = claude_stream_text([e async for e in parsed]) if stream else claude_text(parsed)
            return reply(raw.headers, text)

    return run_async(run())


def anthropic_helpers_sync(stack, key, prompt, stream) -> Reply:
    """`messages.stream(...)`: its `text_stream` and `get_final_message()`; unstreamed, a plain `messages.create`
    read through the client's event hooks, as a user who never asks for the raw response would."""
    seen = ClaudeOutcomes()
    with anthropic.Anthropic(
        base_url=stack.url, api_key=key, max_retries=0, http_client=seen.http_client()
    ) as client:
        ask = dict(model=CLAUDE_MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=claude_messages(prompt))
        if stream:
            with client.messages.stream(**ask) as events:
                deltas = "".join(events.text_stream)
                final = claude_text(events.get_final_message())
            assert deltas == final, "the helper's text stream and its final message disagree"
            return reply(seen.one(), final)
        message = client.messages.create(**ask)
        return reply(seen.one(), claude_text(message))


def anthropic_helpers_async(stack, key, prompt, stream) -> Reply:
    async def run():
        seen = ClaudeOutcomes()
        async with anthropic.AsyncAnthropic(
            base_url=stack.url, api_key=key, max_retries=0, http_client=seen.async_http_client()
        ) as client:
            ask = dict(model=CLAUDE_MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=claude_messages(prompt))
            if stream:
                async with client.messages.stream(**ask) as events:
                    deltas = "".join([t async for t in events.text_stream])
                    final = claude_text(await events.get_final_message())
                assert deltas == final, "the helper's text stream and its final message disagree"
                return reply(seen.one(), final)
            message = await client.messages.create(**ask)
            return reply(seen.one(), claude_text(message))

    return run_async(run())


def chat_anthropic(stack, key):
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(model=CLAUDE_MODEL, base_url=stack.url, api_key=key, max_retries=0, max_tokens=MAX_TOKENS)


def langchain_anthropic(stack, key, prompt, stream) -> Reply:
    """ChatAnthropic keeps the HTTP response to itself (no `include_response_headers`), so the outcome is read from
    the gateway's own record: the one request this call added to /admin/requests."""
    llm = chat_anthropic(stack, key)
    seen = {r["id"] for r in stack.requests(limit=50)}
    if stream:
        text = "".join(lc_text(c) for c in llm.stream(lc_messages(prompt)))
    else:
        text = lc_text(llm.invoke(lc_messages(prompt)))
    return stack.reply_from_record(seen, text)


def langchain_anthropic_async(stack, key, prompt, stream) -> Reply:
    async def run():
        llm = chat_anthropic(stack, key)
        seen = {r["id"] for r in stack.requests(limit=50)}
        if stream:
            text = "".join([lc_text(c) async for c in llm.astream(lc_messages(prompt))])
        else:
            text = lc_text(await llm.ainvoke(lc_messages(prompt)))
        return stack.reply_from_record(seen, text)

    return run_async(run())


CLIENTS = [
    Client("openai-sync", openai_sync),
    Client("openai-async", openai_async),
    Client("openai-helpers-sync", openai_helpers_sync),
    Client("openai-helpers-async", openai_helpers_async),
    Client("langchain-sync", langchain_sync),
    Client("langchain-async", langchain_async),
    Client("agents", agents_run),
    Client("agents-with-tool", functools.partial(agents_run, with_tool=True)),
    Client("responses-sync", responses_sync),
    Client("responses-async", responses_async),
    Client("responses-helpers-sync", responses_helpers_sync),
    Client("responses-helpers-async", responses_helpers_async),
    Client("langchain-responses", langchain_responses),
    Client("agents-responses", functools.partial(agents_run, model_class="OpenAIResponsesModel")),
    Client("anthropic-sync", anthropic_sync),
    Client("anthropic-async", anthropic_async),
    Client("anthropic-helpers-sync", anthropic_helpers_sync),
    Client("anthropic-helpers-async", anthropic_helpers_async),
    Client("langchain-anthropic-sync", langchain_anthropic),
    Client("langchain-anthropic-async", langchain_anthropic_async),
]
