//! Request bodies through the router, in process: any bytes to any
//! generating route answer a response (an OpenAI-shaped 4xx for bad input),
//! never a panic, and never a 5xx.
//!
//! Input: the first byte picks the route, the rest is the body.
#![no_main]

use axum::body::{to_bytes, Body};
use axum::http::Request;
use axum::Router;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tensorfold_engine::Engine;
use tensorfold_server::{router, ServerConfig};
use tower::ServiceExt;

const ROUTES: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/models",
];

fn app() -> &'static (tokio::runtime::Runtime, Router) {
    static APP: OnceLock<(tokio::runtime::Runtime, Router)> = OnceLock::new();
    APP.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let mut engine = Engine::load(tensorfold_fuzz::tiny_gguf()).expect("tiny model");
        // A short window keeps a valid request's reply short.
        engine.set_context(Some(64)).expect("window");
        let mut config = ServerConfig::new("tiny");
        config.max_tokens = 4;
        let (app, _) = runtime.block_on(async { router(engine, config) });
        (runtime, app)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let (runtime, app) = app();
    let route = ROUTES[usize::from(pick) % ROUTES.len()];
    let request = Request::builder()
        .method("POST")
        .uri(route)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("request");
    let (status, answer) = runtime.block_on(async {
        let response = app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let answer = to_bytes(response.into_body(), 1 << 24)
            .await
            .unwrap_or_default();
        (status, answer)
    });
    // The one documented 5xx for a good request: stored responses are
    // bounded, and a full store refuses with 503 (the fuzzer fills it).
    let store_full =
        status == 503 && String::from_utf8_lossy(&answer).contains("response_store_full");
    assert!(
        !status.is_server_error() || store_full,
        "{route} answered {status} to {:?}",
        String::from_utf8_lossy(body)
    );
});
