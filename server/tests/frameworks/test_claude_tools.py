"""A tool call through Anthropic's Python SDK: reprise-sim answers a question with the word `weather` and a tool on
offer with a `tool_use` block, and the repeat is a hit that replays the same call (name and input) in either shape,
as `messages.create` and as `messages.stream(...).get_final_message()`."""

import anthropic

from clients import CLAUDE_MODEL, MAX_TOKENS, ClaudeOutcomes

TOOLS = [{
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
QUESTION = "what is the weather in Paris"


def tool_calls(message) -> list[tuple[str, dict]]:
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def test_a_tool_call_is_replayed_with_its_input(stack):
    key = stack.key("anthropic-tool")
    seen = ClaudeOutcomes()
    with anthropic.Anthropic(base_url=stack.url, api_key=key, max_retries=0, http_client=seen.http_client()) as c:
        ask = dict(model=CLAUDE_MODEL, max_tokens=MAX_TOKENS, tools=TOOLS,
                   messages=[{"role": "user", "content": QUESTION}])
        before = stack.stored()
        first = c.messages.create(**ask)
        assert seen.one().get("x-reprise-cache") == "miss"
        assert first.stop_reason == "tool_use"
        calls = tool_calls(first)
        assert [name for name, _ in calls] == ["get_weather"] and isinstance(calls[0][1], dict), first.content
        stack.wait_stored(before)

        again = c.messages.create(**ask)
        assert seen.one().get("x-reprise-cache") == "hit"
        assert (again.stop_reason, tool_calls(again)) == ("tool_use", calls)
        assert again.id != first.id, "a hit carries a fresh msg_ id"

        # The stored call, rebuilt as events (input_json_delta pieces) and assembled again by the stream helper.
        with c.messages.stream(**ask) as events:
            streamed = events.get_final_message()
        assert seen.one().get("x-reprise-cache") == "hit"
        assert (streamed.stop_reason, tool_calls(streamed)) == ("tool_use", calls)
