"""/v1/responses: stored responses chained by previous_response_id, GET and
DELETE by id, streaming events; and tool calls streamed as deltas."""

import json

import openai
import pytest

MODEL = "test-model"


def test_stored_responses_chain_by_id(client):
    first = client.responses.create(model=MODEL, input="Name a large city in Italy.", max_output_tokens=16,
                                    temperature=0)
    assert first.status in ("completed", "incomplete") and first.output_text
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text

    second = client.responses.create(model=MODEL, input="And one in Spain?", previous_response_id=first.id,
                                     max_output_tokens=16, temperature=0)
    assert second.previous_response_id == first.id
    # The chained request is the whole conversation: the same reply as
    # sending the history by hand, and the first turn's state is reused.
    by_hand = client.responses.create(model=MODEL, max_output_tokens=16, temperature=0, store=False, input=[
        {"role": "user", "content": "Name a large city in Italy."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And one in Spain?"},
    ])
    assert second.output_text == by_hand.output_text
    assert second.usage.input_tokens_details.cached_tokens > 0

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Hi", previous_response_id=first.id, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(by_hand.id)  # store: false keeps nothing


def test_responses_stream_events(client):
    kw = dict(model=MODEL, input="What is the capital of France?", max_output_tokens=24, temperature=0)
    whole = client.responses.create(**kw)
    kinds, text, final = [], "", None
    for event in client.responses.create(stream=True, **kw):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert text == whole.output_text == final.output_text
    assert client.responses.retrieve(final.id).output_text == text


def test_response_store_is_bounded():
    from conftest import ROOT, start

    proc, base = start(ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf", "--stored-responses", "2")
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        ids = [client.responses.create(model=MODEL, input="Hi", max_output_tokens=2).id for _ in range(2)]
        with pytest.raises(openai.APIStatusError) as e:
            client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
        assert e.value.status_code == 503 and "response store is full" in str(e.value)
        # Unstored requests still run; deleting one makes room.
        assert client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False).output_text
        client.responses.delete(ids[0])
        assert client.responses.create(model=MODEL, input="Hi", max_output_tokens=2).id
    finally:
        proc.terminate()
        proc.wait(timeout=10)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]


def test_tool_calls_stream_name_first_then_argument_fragments(qwen):
    msgs = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
    deltas = [tc for chunk in qwen.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, temperature=0,
                                                            max_tokens=60, stream=True)
              for c in chunk.choices if c.delta.tool_calls for tc in c.delta.tool_calls]
    assert deltas[0].function.name == "get_weather" and deltas[0].id and deltas[0].function.arguments == ""
    assert all(d.function.name is None for d in deltas[1:]) and len(deltas) > 2
    arguments = "".join(d.function.arguments for d in deltas)
    assert json.loads(arguments)["city"] == "Paris"
