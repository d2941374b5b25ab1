//! The chat page's routes and the vLLM-named metrics, on a tiny random model.

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use axum::Router;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tensorfold_engine::Engine;
use tensorfold_models::synth::{write_gguf, SynthSpec};
use tensorfold_models::{Arch, Format};
use tensorfold_server::{router, Metrics, ServerConfig};
use tower::ServiceExt;

fn app(api_key: Option<&str>) -> (Router, Arc<Metrics>) {
    let path = std::env::temp_dir().join(format!(
        "tensorfold-page-{}-{}.gguf",
        std::process::id(),
        api_key.is_some()
    ));
    write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 3)).unwrap();
    let mut config = ServerConfig::new("tiny \"model\"");
    config.max_tokens = 8;
    config.api_key = api_key.map(str::to_owned);
    router(Engine::load(&path).unwrap(), config)
}

async fn call(app: &Router, method: &str, path: &str, body: &str) -> (StatusCode, String, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let kind = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, kind, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn the_page_is_served_even_behind_an_api_key() {
    let (app, _) = app(Some("sekret"));
    let (s, kind, html) = call(&app, "GET", "/", "").await;
    assert_eq!(s, StatusCode::OK);
    assert!(kind.starts_with("text/html"), "{kind}");
    assert!(html.contains("<script src=\"/chat.js\">") && html.contains("compare with serial"));
    let (s, kind, js) = call(&app, "GET", "/chat.js", "").await;
    assert_eq!(s, StatusCode::OK);
    assert!(kind.starts_with("text/javascript"), "{kind}");
    assert!(js.contains("\"draft\": false") || js.contains("draft: false"));
    let (s, kind, _) = call(&app, "GET", "/chat.css", "").await;
    assert_eq!((s, kind.starts_with("text/css")), (StatusCode::OK, true));
    // The API itself stays closed.
    assert_eq!(
        call(&app, "GET", "/v1/models", "").await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn metrics_carry_vllm_names() {
    let (app, metrics) = app(None);
    // A stop string holds text back, so pieces and tokens may differ.
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"ignore_eos":true,"stop":["e"],"stream":true}"#;
    let (s, _, reply) = call(&app, "POST", "/v1/chat/completions", body).await;
    assert_eq!(s, StatusCode::OK, "{reply}");
    let (_, kind, text) = call(&app, "GET", "/metrics", "").await;
    assert!(kind.starts_with("text/plain"), "{kind}");
    let value = |name: &str| -> u64 {
        let prefix = format!("{name}{{model_name=\"tiny \\\"model\\\"\"}} ");
        let line = text
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"));
        line[prefix.len()..].parse().unwrap()
    };
    let generated = value("vllm:generation_tokens_total");
    assert!((1..=4).contains(&generated), "{generated}");
    // The live throughput counts tokens, not text pieces.
    assert_eq!(
        metrics.completion_tokens_live.load(Ordering::Relaxed),
        generated
    );
    assert!(value("vllm:prompt_tokens_total") > 0);
    assert_eq!(value("vllm:request_success_total"), 1);
    assert_eq!(value("vllm:num_requests_running"), 0);
    assert_eq!(value("vllm:num_requests_waiting"), 0);
    for name in [
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:prefix_cache_hits_total",
    ] {
        value(name);
        assert!(text.contains(&format!("# TYPE {name} counter")), "{name}");
    }
    // The native names stay.
    assert!(
        text.contains("tensorfold_completion_tokens_total 4"),
        "{text}"
    );
}
