"""Every client in clients.CLIENTS, through the real gateway in front of reprise-sim, gets what a user changing only
`base_url` expects: a first question is a `miss`, the same question again is a `hit` with the same text, a
paraphrase is a `semantic-hit` with the first question's text, and a streamed miss is replayed as a streamed hit
with identical content (and then in the other shape too). Each test asks under its own API key (its own tenant)."""

import pytest

from clients import CLIENTS

# Scored 0.94 by all-MiniLM-L6-v2 (threshold 0.90) and passes every guard, the same pair the Rust semantic tests use.
QUESTION = "how do I reset my password"
PARAPHRASE = "I forgot my password, how can I reset it"

by_name = pytest.mark.parametrize("client", CLIENTS, ids=[c.name for c in CLIENTS])


def served(stack, reply, outcome: str, stream: bool):
    """Checks the header the client read, and that the gateway's own record agrees: same outcome, and a streamed
    request really was one (a client that quietly asked for a whole body would pass the header check alone)."""
    assert reply.outcome == outcome
    record = stack.record(reply.request_id)
    assert (record["cache"], record["stream"], record["status"]) == (outcome, stream, 200)
    return reply


@by_name
def test_a_repeat_is_an_exact_hit_with_the_same_text(stack, client):
    key = stack.key(client.name)
    before = stack.stored()
    first = served(stack, client.ask(stack, key, QUESTION, stream=False), "miss", stream=False)
    assert first.text
    stack.wait_stored(before)
    again = served(stack, client.ask(stack, key, QUESTION, stream=False), "hit", stream=False)
    assert again.text == first.text


@by_name
def test_a_paraphrase_is_a_semantic_hit_with_the_first_answer(stack, client):
    stack.require_semantic()
    key = stack.key(client.name)
    before = stack.stored()
    first = served(stack, client.ask(stack, key, QUESTION, stream=False), "miss", stream=False)
    stack.wait_stored(before)
    paraphrase = served(stack, client.ask(stack, key, PARAPHRASE, stream=False), "semantic-hit", stream=False)
    # reprise-sim answers each prompt with its own words, so equal text means the stored answer was served.
    assert paraphrase.text == first.text


@by_name
def test_a_streamed_miss_replays_as_a_streamed_hit_with_identical_content(stack, client):
    key = stack.key(client.name)
    before = stack.stored()
    first = served(stack, client.ask(stack, key, QUESTION, stream=True), "miss", stream=True)
    assert first.text
    stack.wait_stored(before)
    again = served(stack, client.ask(stack, key, QUESTION, stream=True), "hit", stream=True)
    assert again.text == first.text
    # The entry a stream left serves the non-streamed shape too.
    whole = served(stack, client.ask(stack, key, QUESTION, stream=False), "hit", stream=False)
    assert whole.text == first.text
