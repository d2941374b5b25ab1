//! The router with a tiny random model: routes, errors, streaming, and a
//! property check that no body, however malformed, crashes a handler.

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use axum::Router;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::OnceLock;
use tensorfold_engine::Engine;
use tensorfold_models::synth::{write_gguf, SynthSpec};
use tensorfold_models::{Arch, Format};
use tensorfold_server::{router, ServerConfig};
use tower::ServiceExt;

fn app() -> Router {
    static APP: OnceLock<Router> = OnceLock::new();
    APP.get_or_init(|| {
        let path =
            std::env::temp_dir().join(format!("tensorfold-router-{}.gguf", std::process::id()));
        write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 3)).unwrap();
        let mut config = ServerConfig::new("tiny");
        config.max_tokens = 16;
        router(Engine::load(&path).unwrap(), config).0
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

fn call(method: &str, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    runtime().block_on(async {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let resp = app().oneshot(req).await.unwrap();
        let status = resp.status();
        (
            status,
            to_bytes(resp.into_body(), 1 << 24).await.unwrap().to_vec(),
        )
    })
}

fn post(path: &str, body: Value) -> (StatusCode, Value) {
    let (s, b) = call("POST", path, body.to_string().into_bytes());
    (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

#[test]
fn chat_completion_and_usage() {
    let (s, v) = post(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": true}),
    );
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[test]
fn stream_ends_with_done_and_matches_non_stream() {
    let body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "ignore_eos": true,
                      "temperature": 0.9, "seed": 4});
    let (_, full) = post("/v1/chat/completions", body.clone());
    let mut streaming = body;
    streaming["stream"] = json!(true);
    let (s, raw) = call(
        "POST",
        "/v1/chat/completions",
        streaming.to_string().into_bytes(),
    );
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8(raw).unwrap();
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let content: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        content,
        full["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[test]
fn errors_have_the_right_status_and_shape() {
    let cases = [
        (json!({"messages": []}), StatusCode::BAD_REQUEST),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "n": 3}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "model": "other"}),
            StatusCode::NOT_FOUND,
        ),
        (
            json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000}),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (body, status) in cases {
        let (s, v) = post("/v1/chat/completions", body.clone());
        assert_eq!(s, status, "{body}: {v}");
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    let (_, v) = post(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]}),
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert!(v["error"]["message"].as_str().unwrap().contains("512"));
    assert_eq!(call("GET", "/nowhere", vec![]).0, StatusCode::NOT_FOUND);
    assert_eq!(call("GET", "/health", vec![]).0, StatusCode::OK);
    let (s, m) = call("GET", "/metrics", vec![]);
    assert_eq!(s, StatusCode::OK);
    assert!(String::from_utf8(m)
        .unwrap()
        .contains("tensorfold_requests_total"));
}

#[test]
fn an_api_key_is_required_when_set() {
    let path =
        std::env::temp_dir().join(format!("tensorfold-router-key-{}.gguf", std::process::id()));
    write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 3)).unwrap();
    let mut config = ServerConfig::new("tiny");
    config.api_key = Some("sekret".into());
    let app = router(Engine::load(&path).unwrap(), config).0;
    let status = |auth: Option<&str>| {
        let mut req = Request::builder().uri("/v1/models");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        runtime()
            .block_on(app.clone().oneshot(req.body(Body::empty()).unwrap()))
            .unwrap()
            .status()
    };
    assert_eq!(status(None), StatusCode::UNAUTHORIZED);
    assert_eq!(status(Some("Bearer wrong")), StatusCode::UNAUTHORIZED);
    assert_eq!(status(Some("Bearer sekret")), StatusCode::OK);
    // Health stays open for load balancers.
    let health = Request::builder()
        .uri("/health")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        runtime()
            .block_on(app.clone().oneshot(health))
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "[a-z<>|{} ]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::hash_map(
                prop_oneof![
                    Just("messages".to_string()),
                    Just("role".to_string()),
                    Just("content".to_string()),
                    Just("max_tokens".to_string()),
                    Just("stop".to_string()),
                    Just("tools".to_string()),
                    Just("temperature".to_string()),
                    Just("prompt".to_string()),
                    Just("stream".to_string()),
                    "[a-z_]{1,8}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random JSON and random bytes get an answer (never a dropped
    /// connection or a 500), and every error is OpenAI-shaped.
    #[test]
    fn random_bodies_never_crash(
        body in json_value(),
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        route in proptest::sample::select(vec!["/v1/chat/completions", "/v1/completions", "/v1/responses"]),
    ) {
        for payload in [body.to_string().into_bytes(), bytes.clone()] {
            let (s, b) = call("POST", route, payload);
            prop_assert!(s != StatusCode::INTERNAL_SERVER_ERROR, "{}", String::from_utf8_lossy(&b));
            if !s.is_success() {
                let v: Value = serde_json::from_slice(&b).unwrap();
                prop_assert!(v["error"]["message"].is_string());
            }
        }
    }
}
