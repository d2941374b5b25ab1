//! Reasoning and grammars through the router, with a tiny random Qwen3
//! whose chat template thinks as Qwen3's does. A grammar makes the random
//! model write a `<think>` block, so the split is tested on real replies.

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use std::sync::OnceLock;
use tensorfold_engine::Engine;
use tensorfold_models::synth::{write_hf, SynthSpec};
use tensorfold_models::{Arch, Format};
use tensorfold_server::{router, ServerConfig};
use tower::ServiceExt;

/// Qwen3's switch: with `enable_thinking` false the prompt holds an empty
/// block; `open_think` makes the prompt open one (as DeepSeek-R1's does).
const THINKING_TEMPLATE: &str =
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{%- if add_generation_prompt %}<|im_start|>assistant\n\
{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n\
{%- elif open_think is defined and open_think %}<think>\n{% endif %}{% endif %}";

fn app() -> Router {
    static APP: OnceLock<Router> = OnceLock::new();
    APP.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tensorfold-thinking-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_hf(&dir, &SynthSpec::tiny(Arch::Qwen3, Format::F32, 5)).unwrap();
        let config_path = dir.join("tokenizer_config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
        config["chat_template"] = json!(THINKING_TEMPLATE);
        std::fs::write(&config_path, config.to_string()).unwrap();
        let mut server = ServerConfig::new("tiny-qwen3");
        server.max_tokens = 48;
        router(Engine::load(&dir).unwrap(), server).0
    })
    .clone()
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

fn post(path: &str, body: Value) -> (StatusCode, Vec<u8>) {
    runtime().block_on(async {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = app().oneshot(req).await.unwrap();
        let status = resp.status();
        (
            status,
            to_bytes(resp.into_body(), 1 << 24).await.unwrap().to_vec(),
        )
    })
}

fn post_json(path: &str, body: Value) -> (StatusCode, Value) {
    let (s, b) = post(path, body);
    (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// The chunks of a streamed reply.
fn stream(body: Value) -> Vec<Value> {
    let mut body = body;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (s, raw) = post("/v1/chat/completions", body);
    assert_eq!(s, StatusCode::OK);
    String::from_utf8(raw)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

const THOUGHT: &str =
    r#"start: "<think>" /[a-z]{3,12}( [a-z]{3,12}){2,4}/ "</think>\n\n" /[A-Z][a-z]{2,10}\./"#;

fn ask(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 120,
                          "temperature": 0.8, "seed": 7, "grammar": THOUGHT});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn reasoning_is_split_from_the_answer() {
    let (s, v) = post_json("/v1/chat/completions", ask(json!({})));
    assert_eq!(s, StatusCode::OK, "{v}");
    let message = &v["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap();
    let content = message["content"].as_str().unwrap();
    assert!(
        reasoning.split(' ').count() >= 3 && !reasoning.contains("think"),
        "{v}"
    );
    assert!(content.ends_with('.') && !content.contains("think"), "{v}");
    let details = &v["usage"]["completion_tokens_details"];
    let thinking = details["reasoning_tokens"].as_u64().unwrap();
    assert!(thinking > 0 && thinking < v["usage"]["completion_tokens"].as_u64().unwrap());

    // Streamed: the same split, reasoning deltas first.
    let chunks = stream(ask(json!({})));
    let mut streamed = (String::new(), String::new());
    let mut order = Vec::new();
    for c in &chunks {
        let Some(delta) = c["choices"].get(0).map(|c| &c["delta"]) else {
            continue;
        };
        if let Some(r) = delta["reasoning_content"].as_str() {
            streamed.0 += r;
            order.push('r');
        }
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            streamed.1 += t;
            order.push('c');
        }
    }
    assert_eq!(
        (streamed.0.as_str(), streamed.1.as_str()),
        (reasoning, content)
    );
    assert!(order.windows(2).all(|w| w != ['c', 'r']), "{order:?}");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage["completion_tokens_details"]["reasoning_tokens"],
        thinking
    );

    // `reasoning_format: none` leaves the block in the content.
    let (_, v) = post_json(
        "/v1/chat/completions",
        ask(json!({"reasoning_format": "none"})),
    );
    let message = &v["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none());
    assert_eq!(
        message["content"],
        format!("<think>{reasoning}</think>\n\n{content}")
    );
}

#[test]
fn a_prompt_that_opens_the_block_and_enable_thinking() {
    // The template opens the block: the reply starts inside it.
    let grammar = r#"start: /[a-z]{2,6}( [a-z]{2,6}){2,3}/ "</think>" /[A-Z][a-z]{2,6}\./"#;
    let (s, v) = post_json(
        "/v1/chat/completions",
        ask(json!({"grammar": grammar, "chat_template_kwargs": {"open_think": true}})),
    );
    assert_eq!(s, StatusCode::OK, "{v}");
    let message = &v["choices"][0]["message"];
    assert!(message["reasoning_content"].as_str().unwrap().contains(' '));
    assert!(message["content"].as_str().unwrap().ends_with('.'));

    // enable_thinking false: the template closes an empty block in the
    // prompt, so the reply is all answer.
    let (_, on) = post_json(
        "/tokenize",
        json!({"messages": [{"role": "user", "content": "why?"}]}),
    );
    let (_, off) = post_json(
        "/tokenize",
        json!({"messages": [{"role": "user", "content": "why?"}],
               "chat_template_kwargs": {"enable_thinking": false}}),
    );
    assert!(off["count"].as_u64() > on["count"].as_u64());
    let (_, v) = post_json(
        "/v1/chat/completions",
        ask(json!({"grammar": r#"start: /[A-Z][a-z]{2,10}\./"#,
                   "chat_template_kwargs": {"enable_thinking": false}})),
    );
    let message = &v["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{v}");
    assert!(message["content"].as_str().unwrap().ends_with('.'));
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        0
    );
}

#[test]
fn drafted_equals_serial_under_a_grammar() {
    // A grammar that repeats invites the context drafter.
    let grammar = r#"start: ("ab" | "abc" | "cab" | " "){16,24} ".""#;
    let mut drafted_tokens = 0;
    for (temperature, seed) in [(0.0, 0), (0.9, 3), (1.5, 11)] {
        let body = json!({"messages": [{"role": "user", "content": "ab ab ab abc ab"}],
                          "max_tokens": 80, "temperature": temperature, "seed": seed,
                          "grammar": grammar, "reasoning_format": "none"});
        let (status, drafted) = post_json("/v1/chat/completions", body.clone());
        assert_eq!(status, StatusCode::OK, "{drafted}");
        let mut serial = body;
        serial["draft"] = json!(false);
        let (_, serial) = post_json("/v1/chat/completions", serial);
        drafted_tokens += drafted["usage"]["completion_tokens_details"]["draft_tokens"]
            .as_u64()
            .unwrap();
        let text = drafted["choices"][0]["message"]["content"]
            .as_str()
            .unwrap();
        assert_eq!(text, serial["choices"][0]["message"]["content"]);
        assert!(
            text.chars().all(|c| "abc .".contains(c)),
            "{text:?} breaks the grammar"
        );
    }
    assert!(drafted_tokens > 0, "nothing was drafted");
}

#[test]
fn a_thinking_budget_closes_the_block() {
    let body = json!({"messages": [{"role": "user", "content": "why?"}], "max_tokens": 40,
                      "ignore_eos": true, "temperature": 0.7, "seed": 2, "max_thinking_tokens": 6,
                      "chat_template_kwargs": {"open_think": true}});
    let (s, v) = post_json("/v1/chat/completions", body.clone());
    assert_eq!(s, StatusCode::OK, "{v}");
    let message = &v["choices"][0]["message"];
    let content = message["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{v}");
    // Six tokens of reasoning, then the closing tag the budget forced.
    let reasoning_tokens = v["usage"]["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(reasoning_tokens, 6 + "</think>".len() as u64, "{v}");
    let mut serial = body;
    serial["draft"] = json!(false);
    let (_, serial) = post_json("/v1/chat/completions", serial);
    assert_eq!(serial["choices"][0]["message"], *message);
}
