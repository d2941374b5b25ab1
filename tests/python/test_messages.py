"""Anthropic's Messages API, driven by the official anthropic client."""

import json

import anthropic
import pytest

MODEL = "test-model"
PARIS = [{"role": "user", "content": "Name the capital of France."}]


def sampled(temperature, seed=None):
    """Sampling fields as extra body fields: this client version takes no
    `temperature` argument; the server reads it as Anthropic's API does."""
    body = {"temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    return {"extra_body": body}


def test_messages_answer_and_usage(claude, client):
    m = claude.messages.create(model=MODEL, max_tokens=24, messages=PARIS, **sampled(0))
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and "Paris" in m.content[0].text
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens > 0
    # The same conversation through chat completions gives the same reply.
    r = client.chat.completions.create(model=MODEL, max_tokens=24, messages=PARIS, **sampled(0))
    assert m.content[0].text == r.choices[0].message.content

    # System prompt (text or blocks) and content blocks render alike.
    a = claude.messages.create(model=MODEL, max_tokens=16, **sampled(0), system="Answer in French.",
                               messages=[{"role": "user", "content": [{"type": "text", "text": "Hello!"}]}])
    b = claude.messages.create(model=MODEL, max_tokens=16, **sampled(0),
                               system=[{"type": "text", "text": "Answer in French."}],
                               messages=[{"role": "user", "content": "Hello!"}])
    assert a.content[0].text == b.content[0].text


def test_max_tokens_and_stop_sequences(claude):
    full = claude.messages.create(model=MODEL, max_tokens=24, messages=PARIS, **sampled(0)).content[0].text
    word = "Paris"
    m = claude.messages.create(model=MODEL, max_tokens=24, messages=PARIS, stop_sequences=[word], **sampled(0))
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == full[: full.index(word)]
    m = claude.messages.create(model=MODEL, max_tokens=3, messages=PARIS, **sampled(0))
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_streaming_events_in_order(claude):
    kw = dict(model=MODEL, max_tokens=32, messages=PARIS, **sampled(0.8, seed=3))
    whole = claude.messages.create(**kw)
    events = []
    with claude.messages.stream(**kw) as stream:
        for event in stream:
            events.append(event.type)
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # message_start, a text block opened, deltas, closed, message_delta, message_stop.
    raw = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop")]
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}


def test_count_tokens(claude, server):
    n = claude.messages.count_tokens(model=MODEL, messages=PARIS)
    import urllib.request
    req = urllib.request.Request(server + "/tokenize", data=json.dumps({"messages": PARIS}).encode(),
                                 headers={"content-type": "application/json"})
    assert n.input_tokens == json.load(urllib.request.urlopen(req))["count"]


def test_errors_in_anthropic_shape(claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "wizard", "content": "hi"}])
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages[0].role" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=8, messages=[])


WEATHER_TOOL = {
    "name": "get_weather", "description": "Weather forecast for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                     "required": ["city"]},
}
WEATHER = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


def test_tools_with_tool_use_and_tool_result(qwen_claude):
    m = qwen_claude.messages.create(model=MODEL, max_tokens=60, messages=WEATHER, tools=[WEATHER_TOOL],
                                    **sampled(0))
    assert m.stop_reason == "tool_use", m.content
    use = next(b for b in m.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input["city"] == "Paris"
    assert use.id.startswith("toolu")

    # Streamed: the tool_use block arrives with its input as JSON deltas.
    with qwen_claude.messages.stream(model=MODEL, max_tokens=60, messages=WEATHER, tools=[WEATHER_TOOL],
                                     **sampled(0)) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    streamed_use = next(b for b in final.content if b.type == "tool_use")
    assert streamed_use.input == use.input and final.stop_reason == "tool_use"
    assert "input_json" in kinds or "content_block_delta" in kinds

    # The result goes back as a tool_result block and is answered in text.
    history = WEATHER + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "Sunny, 21 C, all three days"}]},
    ]
    m = qwen_claude.messages.create(model=MODEL, max_tokens=40, messages=history, tools=[WEATHER_TOOL],
                                    **sampled(0))
    assert m.content[0].type == "text" and m.content[0].text
    # tool_choice none hides the tools.
    m = qwen_claude.messages.create(model=MODEL, max_tokens=30, messages=WEATHER, tools=[WEATHER_TOOL],
                                    tool_choice={"type": "none"}, **sampled(0))
    assert all(b.type == "text" for b in m.content)
