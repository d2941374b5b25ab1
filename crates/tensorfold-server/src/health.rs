//! `GET /health`: whether the engine can serve now, and why not.
//!
//! The worker reports here: a device that stopped answering after a failed
//! round makes the server unhealthy until a later round succeeds, and a
//! worker thread that has ended makes it unhealthy for good.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Mutex;

/// Why the engine cannot serve, if it cannot.
#[derive(Default)]
pub struct Health {
    problem: Mutex<Option<String>>,
}

impl Health {
    /// `None` when the engine can serve, else the reason.
    pub fn problem(&self) -> Option<String> {
        self.lock().clone()
    }

    pub fn set_problem(&self, reason: impl Into<String>) {
        *self.lock() = Some(reason.into());
    }

    pub fn clear(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // The value is a whole `Option` written at once: a poisoned lock
        // still holds a consistent one.
        self.problem.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// 200 `{"status": "ok"}`, or 503 `{"status": "error", "reason": ...}`.
pub(crate) async fn health(State(s): State<crate::Shared>) -> Response {
    let problem = s.health.problem().or_else(|| {
        (!s.worker.is_alive()).then(|| "the generation worker has stopped".to_string())
    });
    match problem {
        None => Json(json!({"status": "ok"})).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "reason": reason})),
        )
            .into_response(),
    }
}
