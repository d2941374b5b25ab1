//! Errors in OpenAI's JSON shape, with the status a client expects.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            code: None,
            param: None,
        }
    }

    pub fn param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_string());
        self
    }

    pub fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            code: Some(code),
            param: None,
        }
    }

    pub fn overloaded(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            code: Some("overloaded"),
            param: None,
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key".into(),
            kind: "invalid_request_error",
            code: Some("invalid_api_key"),
            param: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            code: None,
            param: None,
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<tensorfold_engine::EngineError> for ApiError {
    fn from(e: tensorfold_engine::EngineError) -> ApiError {
        use tensorfold_engine::EngineError as E;
        match e {
            E::ContextLength { prompt, window } => ApiError::bad_request(format!(
                "This model's maximum context length is {window} tokens. However, your prompt has {prompt} tokens."
            ))
            .code("context_length_exceeded")
            .param("messages"),
            E::Invalid(m) => ApiError::bad_request(m),
            E::Busy => ApiError::overloaded("the server is at capacity; retry later"),
            other => ApiError::internal(other.to_string()),
        }
    }
}
