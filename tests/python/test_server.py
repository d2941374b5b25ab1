"""The server driven over HTTP by the official openai client."""

import json
import threading
import time
import urllib.request

import openai
import pytest

MODEL = "test-model"
PARIS = [{"role": "user", "content": "Name the capital of France."}]


def chat(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", PARIS)
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(**kw)


def test_models_and_health(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert json.load(urllib.request.urlopen(server + "/health"))["status"] == "ok"


def test_chat_answers_paris(client):
    r = chat(client, temperature=0)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


def test_follow_up_turns_reuse_the_conversation(client):
    first = chat(client, temperature=0, messages=[{"role": "user", "content": "Name a large city in Italy."}])
    turn = [{"role": "user", "content": "Name a large city in Italy."},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And one in Spain?"}]
    resumed = chat(client, temperature=0.7, seed=4, messages=turn)
    fresh = chat(client, temperature=0.7, seed=4, messages=turn, extra_body={"cache_prompt": False})
    assert resumed.usage.prompt_tokens_details.cached_tokens > 0
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert resumed.choices[0].message.content == fresh.choices[0].message.content


def test_stream_equals_non_stream(client):
    for kw in [dict(temperature=0), dict(temperature=0.9, seed=11, top_p=0.9)]:
        full = chat(client, max_tokens=40, **kw)
        stream = chat(client, max_tokens=40, stream=True, stream_options={"include_usage": True}, **kw)
        text, finish, usage = "", None, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        assert text == full.choices[0].message.content
        assert finish == full.choices[0].finish_reason
        assert usage.completion_tokens == full.usage.completion_tokens


def test_drafted_equals_serial(client):
    msgs = [{"role": "user", "content": "Repeat this list exactly: apple, banana, cherry, apple, banana, cherry."}]
    for kw in [dict(temperature=0), dict(temperature=0.8, seed=5)]:
        drafted = chat(client, messages=msgs, max_tokens=48, **kw)
        serial = chat(client, messages=msgs, max_tokens=48, extra_body={"draft": False}, **kw)
        assert drafted.choices[0].message.content == serial.choices[0].message.content


def test_seeds(client):
    a = chat(client, temperature=1.0, seed=42, max_tokens=32)
    b = chat(client, temperature=1.0, seed=42, max_tokens=32)
    assert a.choices[0].message.content == b.choices[0].message.content
    others = {chat(client, temperature=1.2, seed=s, max_tokens=32).choices[0].message.content for s in range(4)}
    assert len(others) > 1


def test_completions_raw_prompt(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert "Paris" in r.choices[0].text
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True)
        if c.choices
    )
    assert streamed == r.choices[0].text


def test_stop_strings(client):
    full = chat(client, temperature=0).choices[0].message.content
    r = chat(client, temperature=0, stop=["Paris"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[: full.index("Paris")]
    r = chat(client, temperature=0, stop="France")
    assert "France" not in r.choices[0].message.content


def test_ignore_eos_runs_to_max_tokens(client):
    r = chat(client, temperature=0, max_tokens=30, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 30
    assert r.choices[0].finish_reason == "length"


def test_logprobs(client):
    r = chat(client, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob)


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather forecast for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The current time", "parameters": None}},
]
WEATHER = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


def test_tools_are_parsed_into_tool_calls(qwen):
    r = chat(qwen, messages=WEATHER, tools=TOOLS, temperature=0, max_tokens=60)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert args["city"] == "Paris" and isinstance(args.get("days", 3), int)

    streamed = [c for chunk in chat(qwen, messages=WEATHER, tools=TOOLS, temperature=0, max_tokens=60, stream=True)
                for c in chunk.choices]
    deltas = [tc for c in streamed if c.delta.tool_calls for tc in c.delta.tool_calls]
    assert deltas[0].function.name == "get_weather"
    # Name first, then the arguments in fragments.
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == args
    assert streamed[-1].finish_reason == "tool_calls"

    # A named tool_choice offers that function alone.
    r = chat(qwen, messages=WEATHER, tools=TOOLS, temperature=0, max_tokens=60,
             tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
    assert len(r.choices[0].message.tool_calls) == 1

    # The tool's result in the history renders and is answered in text.
    history = WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 21 C, all three days"},
    ]
    r = chat(qwen, messages=history, tools=TOOLS, temperature=0, max_tokens=40)
    assert r.choices[0].message.content


def test_tool_choice_none_hides_tools(qwen):
    r = chat(qwen, messages=WEATHER, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=30)
    assert r.choices[0].message.tool_calls is None


def test_responses_basic(client):
    r = client.responses.create(model=MODEL, input="Name the capital of France.", max_output_tokens=24,
                                temperature=0)
    assert "Paris" in r.output_text


def test_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, n=2)
    assert "n" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        chat(client, model="no-such-model")
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages=[{"role": "user", "content": "word " * 9000}])
    assert e.value.code == "context_length_exceeded" and "8192" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, max_tokens=100000)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        chat(client, temperature=-1)
    with pytest.raises(openai.BadRequestError):
        chat(client, messages=[])


def raw(server, path, body, method="POST"):
    req = urllib.request.Request(server + path, data=body, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_malformed_bodies_get_400(server):
    for body in [b"{", b"[]", b"null", b'{"messages": "x"}', b'{"messages": [{"content": "x"}]}',
                 b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}',
                 b'{"messages": [{"role": "user", "content": "x"}], "stop": 5}', b"\xff\xfe"]:
        status, err = raw(server, "/v1/chat/completions", body)
        assert status == 400, body
        assert err["error"]["type"] == "invalid_request_error"
    status, err = raw(server, "/v1/nothing", b"{}")
    assert status == 404


def metric(server, name):
    text = urllib.request.urlopen(server + "/metrics").read().decode()
    return int(next(l.split()[1] for l in text.splitlines() if l.startswith(name + " ")))


def test_disconnect_cancels_generation(server, client):
    before = metric(server, "tensorfold_requests_cancelled_total")
    body = json.dumps({"model": MODEL, "messages": PARIS, "max_tokens": 4000, "stream": True,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(server + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=60)
    resp.readline()
    resp.close()  # the client goes away mid-reply
    for _ in range(100):
        if metric(server, "tensorfold_requests_cancelled_total") > before:
            break
        time.sleep(0.1)
    assert metric(server, "tensorfold_requests_cancelled_total") == before + 1
    # The worker is free again: a new request is answered promptly.
    assert "Paris" in chat(client, temperature=0).choices[0].message.content


def test_concurrent_streams_equal_solo(client):
    """Eight requests at once, mixed settings: each reply equals the same
    request served alone without drafts."""
    prompts = ["Name the capital of France.", "Repeat exactly: red, green, blue, red, green, blue.",
               "Write a haiku about the sea.", "Count from one to ten."]
    settings = [dict(temperature=0), dict(temperature=0.8, seed=3), dict(temperature=1.1, seed=8, top_p=0.9),
                dict(temperature=0, stop=["\n"])]
    requests = [dict(messages=[{"role": "user", "content": prompts[i % 4]}], max_tokens=20 + 4 * i,
                     **settings[(i // 2) % 4]) for i in range(8)]
    solo = [chat(client, extra_body={"draft": False}, **r).choices[0].message.content for r in requests]
    results = [None] * len(requests)

    def go(i):
        results[i] = chat(client, **requests[i]).choices[0].message.content

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == solo


def test_memory_budget_sets_the_window(monkeypatch):
    from conftest import ROOT, start

    model = ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf"
    monkeypatch.setenv("TENSORFOLD_MEMORY_LIMIT_GB", "0.6")
    proc, base = start(model)
    try:
        window = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["max_model_len"]
        assert 256 < window < 8192, window
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, messages=[{"role": "user", "content": "word " * window}])
        assert e.value.code == "context_length_exceeded" and str(window) in str(e.value)
        assert chat(client, temperature=0).choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # An explicit window the budget cannot hold is refused at startup, saying what fits.
    with pytest.raises(RuntimeError) as e:
        start(model, "--context", "8192")
    assert "at most" in str(e.value) and "8192" in str(e.value)
