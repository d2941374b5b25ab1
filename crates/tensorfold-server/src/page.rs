//! The chat page at `/`: plain HTML, CSS and JavaScript built into the
//! binary (no build step), talking to the same API any client uses.

use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../static/index.html");
const SCRIPT: &str = include_str!("../static/chat.js");
const STYLE: &str = include_str!("../static/chat.css");

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    ([("content-type", content_type)], body)
}

/// `/`, `/chat.js` and `/chat.css`; open like `/health` and `/metrics`
/// (the page sends the API key the user types with its API calls).
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/chat.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/chat.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}
