//! An OpenAI-compatible HTTP server over the TensorFold engine.
//!
//! Routes: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions`,
//! `POST /v1/completions`, `POST /v1/responses`, `POST /tokenize`,
//! `POST /detokenize`, `GET /props`, `GET /metrics`, Anthropic's
//! `POST /v1/messages` and `POST /v1/messages/count_tokens`, and a chat
//! page at `/`. Replies are the engine's, so a drafted reply is
//! byte-identical to `"draft": false`.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! let engine = tensorfold_engine::Engine::load("models/smollm2-135m-instruct-q4_1.gguf".as_ref()).unwrap();
//! let config = tensorfold_server::ServerConfig::new("smollm2");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! tensorfold_server::serve(listener, engine, config).await
//! # }
//! ```

mod body;
mod chat;
mod completions;
mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
mod health;
mod messages;
mod metrics;
mod page;
mod reasoning;
mod request;
mod responses;
mod store;
mod tokenize;
mod tools;
mod worker;

pub use error::ApiError;
pub use health::Health;
pub use metrics::{rss_bytes, Metrics};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use tensorfold_engine::{Engine, SamplingParams};
use worker::Worker;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model id clients name.
    pub name: String,
    /// Reply length when a request sets none.
    pub max_tokens: usize,
    /// Sampling when a request sets none (the model's generation config).
    pub sampling: SamplingParams,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Requests that may wait for the worker before new ones get 503.
    pub queue: usize,
    /// Responses `/v1/responses` keeps at most (for `previous_response_id`).
    pub stored_responses: usize,
}

impl ServerConfig {
    pub fn new(name: &str) -> ServerConfig {
        ServerConfig {
            name: name.to_string(),
            max_tokens: 1024,
            sampling: SamplingParams::default(),
            api_key: None,
            max_body_bytes: 8 << 20,
            queue: 64,
            stored_responses: 1024,
        }
    }
}

pub(crate) struct AppState {
    pub engine: Arc<Engine>,
    pub config: ServerConfig,
    pub worker: Worker,
    pub metrics: Arc<Metrics>,
    pub responses: store::ResponseStore,
    pub health: Arc<Health>,
}

pub(crate) type Shared = Arc<AppState>;

/// Builds the router (for embedding in another axum app or tests), with the
/// counters it updates.
pub fn router(engine: Engine, config: ServerConfig) -> (Router, Arc<Metrics>) {
    let engine = Arc::new(engine);
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::default());
    let worker = Worker::start(
        engine.clone(),
        config.queue,
        metrics.clone(),
        health.clone(),
    );
    let limit = config.max_body_bytes;
    let responses = store::ResponseStore::new(config.stored_responses);
    let state = Arc::new(AppState {
        engine,
        config,
        worker,
        metrics: metrics.clone(),
        responses,
        health,
    });
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/responses", post(responses::responses))
        .route(
            "/v1/responses/{id}",
            get(responses::get_response).delete(responses::delete_response),
        )
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/props", get(tokenize::props))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authorize,
        ));
    let app = Router::new()
        .route("/health", get(health::health))
        .route("/metrics", get(metrics_text))
        .merge(page::routes())
        .merge(api)
        .fallback(|| async { ApiError::not_found("unknown route", "not_found") })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state);
    (app, metrics)
}

/// Serves until the listener fails or the process is stopped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Engine,
    config: ServerConfig,
) -> std::io::Result<()> {
    let (app, _) = router(engine, config);
    axum::serve(listener, app).await
}

/// Bearer check with a constant-time comparison.
async fn authorize(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.config.api_key {
        use subtle::ConstantTimeEq;
        // OpenAI clients send a bearer token, Anthropic clients `x-api-key`.
        let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
        let given = header(AUTHORIZATION.as_str())
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| header("x-api-key"))
            .unwrap_or("");
        if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn models(State(s): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.config.name,
            "object": "model",
            "created": 0,
            "owned_by": "tensorfold",
            "max_model_len": s.engine.window(),
        }],
    }))
}

async fn metrics_text(State(s): State<Shared>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render() + &s.metrics.render_vllm(&s.config.name),
    )
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{prefix}-{:x}{:06x}",
        now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
