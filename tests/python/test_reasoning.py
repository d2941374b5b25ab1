"""The reasoning channel through the openai client: SmolLM2 served with a
Qwen3-style thinking template (`--chat-template-file`), a grammar making it
write a `<think>` block, so the split is checked on real replies."""

import json
import urllib.request

import pytest

MODEL = "test-model"

# Qwen3's switches: `enable_thinking` false closes an empty block in the
# prompt; `open_think` opens one there (as DeepSeek-R1's template does).
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- elif open_think is defined and open_think %}<think>\n{% endif %}{% endif %}"
)
THOUGHT = r'start: "<think>" /[a-z]{2,8}( [a-z]{2,8}){2,5}/ "</think>\n\n" /[A-Z][a-z]{2,8}( [a-z]{2,8}){0,4}\./'
ASK = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    from conftest import ROOT, openai_client, start

    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(TEMPLATE)
    proc, base = start(ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf", "--chat-template-file", str(template))
    yield openai_client(base, 120), base
    proc.terminate()
    proc.wait(timeout=10)


def ask(client, **kw):
    extra = {"grammar": THOUGHT, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=100, extra_body=extra, **kw)


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, seed=4)])
def test_reasoning_is_split_streamed_and_not(thinking, sampling):
    client, _ = thinking
    r = ask(client, **sampling)
    message = r.choices[0].message
    reasoning, content = message.model_extra["reasoning_content"], message.content
    assert len(reasoning.split()) >= 3 and "think" not in reasoning, r
    assert content.endswith(".") and "think" not in content, r
    thinking_tokens = r.usage.completion_tokens_details.reasoning_tokens
    assert 0 < thinking_tokens < r.usage.completion_tokens

    streamed, answer, usage, order = "", "", None, []
    for chunk in ask(client, stream=True, stream_options={"include_usage": True}, **sampling):
        usage = chunk.usage or usage
        for c in chunk.choices:
            piece = (c.delta.model_extra or {}).get("reasoning_content")
            if piece:
                streamed += piece
                order.append("reasoning")
            if c.delta.content:
                answer += c.delta.content
                order.append("content")
    assert (streamed, answer) == (reasoning, content)
    assert order == sorted(order, key=lambda kind: kind == "content")  # reasoning first
    assert usage.completion_tokens_details.reasoning_tokens == thinking_tokens

    # reasoning_format none: the block stays in the content.
    raw = ask(client, extra_body={"reasoning_format": "none"}, **sampling).choices[0].message
    assert raw.content == f"<think>{reasoning}</think>\n\n{content}"


def test_enable_thinking_and_the_thinking_budget(thinking):
    client, base = thinking

    def tokenize(body):
        req = urllib.request.Request(base + "/tokenize", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        return json.load(urllib.request.urlopen(req))

    on = tokenize({"messages": ASK})["count"]
    off = tokenize({"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}})["count"]
    assert off > on
    # Thinking off: the prompt closed an empty block, so the reply is all answer.
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=30, temperature=0, extra_body={
        "grammar": r'start: /[A-Z][a-z]{2,8}( [a-z]{2,8}){0,4}\./',
        "chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content.endswith(".")
    assert (r.choices[0].message.model_extra or {}).get("reasoning_content") is None
    assert r.usage.completion_tokens_details.reasoning_tokens == 0

    # A budget of 5 tokens: the block the prompt opened is closed for the model.
    close = tokenize({"content": "</think>\n\n", "add_special": False})["count"]
    kw = dict(model=MODEL, messages=ASK, max_tokens=40, temperature=0.8, seed=2,
              extra_body={"max_thinking_tokens": 5, "ignore_eos": True, "chat_template_kwargs": {"open_think": True}})
    r = client.chat.completions.create(**kw)
    message = r.choices[0].message
    assert message.model_extra["reasoning_content"] and message.content, r
    assert 5 < r.usage.completion_tokens_details.reasoning_tokens <= 5 + close
    kw["extra_body"]["draft"] = False
    assert client.chat.completions.create(**kw).choices[0].message == message
