"""Structured output through llguidance: JSON schemas, JSON objects,
grammars and regular expressions, checked with the jsonschema package;
drafted replies equal serial ones under a grammar."""

import json
import urllib.request

import jsonschema
import openai
import pytest

MODEL = "test-model"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person who lives in Paris as JSON."}]


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, seed=3), dict(temperature=1.3, seed=8)])
def test_json_schema_reply_validates(client, sampling):
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=120,
                                       response_format=schema_format(PERSON), **sampling)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    reply = json.loads(r.choices[0].message.content)
    jsonschema.validate(reply, PERSON)


def test_json_schema_streamed_equals_whole(client):
    kw = dict(model=MODEL, messages=ASK, max_tokens=120, response_format=schema_format(PERSON),
              temperature=0.8, seed=5)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(whole), PERSON)


def test_json_object_on_completions_and_responses(client):
    r = client.completions.create(model=MODEL, prompt="A JSON object describing a cat:", max_tokens=100,
                                  temperature=0, extra_body={"response_format": {"type": "json_object"}})
    text = r.choices[0].text
    assert text.lstrip().startswith("{"), text
    if r.choices[0].finish_reason == "stop":  # a small model may ramble on until max_tokens
        assert isinstance(json.loads(text), dict)
    r = client.completions.create(model=MODEL, prompt="A person who lives in Paris, as JSON:", max_tokens=120,
                                  temperature=0.7, seed=1, extra_body={"response_format": schema_format(PERSON)})
    assert r.choices[0].finish_reason == "stop", r.choices[0].text
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    r = client.responses.create(model=MODEL, input="Describe a person who lives in Paris as JSON.",
                                max_output_tokens=120, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(r.output_text), PERSON)


def test_regex_and_grammars(client):
    question = [{"role": "user", "content": "Is Paris the capital of France?"}]
    r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=10, temperature=0,
                                       extra_body={"regex": "(yes|no), [a-z]{2,8}\\."})
    import re
    assert re.fullmatch(r"(yes|no), [a-z]{2,8}\.", r.choices[0].message.content), r.choices[0].message.content
    lark = 'start: "Answer: " ("yes" | "no") "."'
    r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=10, temperature=0,
                                       extra_body={"grammar": lark})
    assert r.choices[0].message.content in ("Answer: yes.", "Answer: no.")
    gbnf = 'root ::= "Answer: " answer "."\nanswer ::= "yes" | "no"  # either\n'
    g = client.chat.completions.create(model=MODEL, messages=question, max_tokens=10, temperature=0,
                                       extra_body={"grammar": gbnf})
    assert g.choices[0].message.content == r.choices[0].message.content


def test_drafted_equals_serial_under_a_grammar(client):
    items = {"type": "object",
             "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8}},
             "required": ["items"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Repeat this list as JSON exactly: apple, banana, cherry, apple, banana, cherry."}]
    drafted_tokens = 0
    for sampling in [dict(temperature=0), dict(temperature=0.8, seed=5), dict(temperature=1.2, seed=9)]:
        kw = dict(model=MODEL, messages=msgs, max_tokens=150, response_format=schema_format(items), **sampling)
        drafted = client.chat.completions.create(**kw)
        serial = client.chat.completions.create(extra_body={"draft": False}, **kw)
        assert drafted.choices[0].message.content == serial.choices[0].message.content
        assert serial.usage.completion_tokens_details.draft_tokens == 0
        drafted_tokens += drafted.usage.completion_tokens_details.draft_tokens
        jsonschema.validate(json.loads(drafted.choices[0].message.content), items)
    assert drafted_tokens > 0  # the drafter proposed under the grammar


def test_a_grammar_that_does_not_compile_is_a_400(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                       response_format=schema_format({"type": "object", "$ref": "#/$defs/missing"}))
    assert e.value.param == "response_format" and "grammar" in str(e.value)
    for field, bad in [("regex", "(unclosed"), ("grammar", "start: (\"a\""), ("grammar", "root ::= undefined-rule")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, extra_body={field: bad})
        assert e.value.param == field, (field, bad)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                       extra_body={"regex": "a", "grammar": 'start: "a"'})
    assert "one of" in str(e.value)
    body = json.dumps({"messages": ASK, "response_format": {"type": "yaml"}}).encode()
    req = urllib.request.Request(server + "/v1/chat/completions", data=body, headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and json.load(e.value)["error"]["param"].startswith("response_format")
