"""The server's typed request bodies, tokenizer routes, props, and resume
over HTTP (generated ids kept when a reply comes back)."""

import json
import urllib.request

import openai
import pytest

MODEL = "test-model"


def call(server, path, body=None, method="POST"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_a_bad_field_is_named_in_the_400(server, client):
    status, err = call(server, "/v1/chat/completions",
                       {"messages": [{"role": "wizard", "content": "hi"}]})
    assert status == 400 and err["error"]["param"] == "messages[0].role", err
    status, err = call(server, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"})
    assert status == 400 and err["error"]["param"] == "temperature", err
    assert err["error"]["type"] == "invalid_request_error"
    status, err = call(server, "/v1/completions", {"prompt": "hi", "max_tokens": "many"})
    assert status == 400 and err["error"]["param"] == "max_tokens", err
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"top_k": "x"})
    assert e.value.param == "top_k"
    # Fields the server does not know are ignored, as OpenAI's API does.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       user="someone", frequency_penalty=0, extra_body={"not_a_field": 1})
    assert r.usage.completion_tokens > 0


def test_tokenize_round_trip(server):
    text = "The capital of France is Paris. Ünïcødé ✓"
    status, out = call(server, "/tokenize", {"content": text, "with_pieces": True})
    assert status == 200 and out["count"] == len(out["tokens"]) > 0
    ids = [t["id"] for t in out["tokens"]]
    # A piece is one token's text (a character split across tokens shows as U+FFFD).
    assert "".join(t["piece"] for t in out["tokens"]).startswith("The capital of France is Paris.")
    status, back = call(server, "/detokenize", {"tokens": ids})
    assert status == 200 and back["content"] == text
    status, plain = call(server, "/tokenize", {"content": text, "add_special": False})
    # Without the model's BOS (where it adds one) the ids are the same.
    assert len(ids) - len(plain["tokens"]) in (0, 1) and plain["tokens"] == ids[len(ids) - len(plain["tokens"]):]

    # With the chat template: the rendered prompt, as a chat request counts it.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    status, chat = call(server, "/tokenize", {"messages": messages})
    assert status == 200
    status, reply = call(server, "/v1/chat/completions",
                         {"messages": messages, "max_tokens": 1, "cache_prompt": False})
    assert chat["count"] == reply["usage"]["prompt_tokens"]
    status, rendered = call(server, "/detokenize", {"tokens": chat["tokens"]})
    assert "What is the capital of France?" in rendered["content"]
    _, closed = call(server, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert closed["count"] < chat["count"]

    status, err = call(server, "/detokenize", {"tokens": [10**9]})
    assert status == 400 and err["error"]["param"] == "tokens[0]"
    status, err = call(server, "/tokenize", {})
    assert status == 400


def test_props(server):
    status, props = call(server, "/props", method="GET")
    assert status == 200
    models = json.load(urllib.request.urlopen(server + "/v1/models"))
    assert props["model"] == MODEL
    assert props["window"] == models["data"][0]["max_model_len"] == props["default_generation_settings"]["n_ctx"]
    assert props["chat_template"] and props["total_slots"] >= 1
    assert props["default_generation_settings"]["params"]["max_tokens"] > 0


def test_a_reply_sent_back_keeps_its_generated_ids(server, client):
    """Sampled replies often spell text that tokenizes into other ids than
    the ones generated; sent back as the start of the next prompt, the whole
    reply is still reused (the generated ids stay the truth)."""
    # Longer than MIN_REUSE tokens: a retained state is found by a common
    # token prefix of at least that many before its text is compared.
    prompt = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
    _, prompt_ids = call(server, "/tokenize", {"content": prompt})
    for seed in range(100):
        first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=1.5, seed=seed,
                                          logprobs=1, extra_body={"ignore_eos": True})
        text = first.choices[0].text
        if "" in first.choices[0].logprobs.tokens:
            continue  # a special token (an end of text, under ignore_eos) that the text leaves out: not reusable
        _, again = call(server, "/tokenize", {"content": prompt + text})
        generated = prompt_ids["count"] + first.usage.completion_tokens
        if again["count"] == generated or "\ufffd" in text:
            continue  # it re-tokenizes into as many ids, or ends inside a character; try another
        follow = client.completions.create(model=MODEL, prompt=prompt + text + " And then", max_tokens=4,
                                           temperature=0)
        # Everything the first request ran through the model is reused: the
        # prompt and every generated token but the last (never fed back).
        assert follow.usage.prompt_tokens_details.cached_tokens >= generated - 1, (seed, text)
        fresh = client.completions.create(model=MODEL, prompt=prompt + text + " And then", max_tokens=4,
                                          temperature=0, extra_body={"cache_prompt": False})
        assert fresh.usage.prompt_tokens_details.cached_tokens == 0
        return
    pytest.fail("no sampled reply re-tokenized differently")
