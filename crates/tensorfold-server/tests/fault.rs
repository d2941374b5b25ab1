//! Fault isolation: a panic inside a round ends that round's streams with
//! an error, and the worker goes on serving the next request.

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tensorfold_engine::Engine;
use tensorfold_models::synth::{write_gguf, SynthSpec};
use tensorfold_models::{Arch, Format};
use tensorfold_server::{fault, router, ServerConfig};
use tower::ServiceExt;

async fn call(app: &Router, method: &str, path: &str, body: Value) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 24).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_round_ends_its_streams_and_the_worker_serves_on() {
    let path = std::env::temp_dir().join(format!("tensorfold-fault-{}.gguf", std::process::id()));
    write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 5)).unwrap();
    let (app, _) = router(Engine::load(&path).unwrap(), ServerConfig::new("tiny"));
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                      "ignore_eos": true, "temperature": 0});
    let (status, healthy) = call(&app, "POST", "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{healthy}");

    fault::panic_in_next_rounds(1);
    let (status, failed) = call(&app, "POST", "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{failed}");
    let error: Value = serde_json::from_str(&failed).unwrap();
    assert_eq!(error["error"]["type"], "server_error", "{error}");

    // The next request is served, with the reply it had before the fault.
    let (status, again) = call(&app, "POST", "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    let text = |reply: &str| {
        let v: Value = serde_json::from_str(reply).unwrap();
        v["choices"][0]["message"]["content"].clone()
    };
    assert_eq!(text(&again), text(&healthy));

    // A stream that faults ends with an error event, then `[DONE]`.
    fault::panic_in_next_rounds(1);
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (status, events) = call(&app, "POST", "/v1/chat/completions", streaming).await;
    assert_eq!(status, StatusCode::OK);
    assert!(events.contains("\"error\""), "{events}");
    assert!(events.trim_end().ends_with("data: [DONE]"), "{events}");

    let (status, health) = call(&app, "GET", "/health", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{health}");
    let (_, metrics) = call(&app, "GET", "/metrics", Value::Null).await;
    assert_eq!(metric(&metrics, "tensorfold_round_faults_total"), 2);
    assert_eq!(metric(&metrics, "tensorfold_reserved_cache_bytes"), 0);
    let (status, last) = call(&app, "POST", "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{last}");
    let _ = std::fs::remove_file(path);
}
