//! What every generating route shares: reading the body, the sampling and
//! length fields, the window checks, and running the job.

use crate::error::ApiError;
use crate::worker::Event;
use crate::Shared;
use serde_json::Value;
use std::sync::atomic::Ordering;
use tensorfold_engine::{Completion, GenerateRequest, Prompt, SamplingParams};
use tokio::sync::mpsc::UnboundedReceiver;

/// Parses a JSON object body; anything else is a 400.
pub fn parse_body(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request("request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
    }
}

fn number(body: &serde_json::Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ApiError::bad_request(format!("'{key}' must be a number")).param(key)),
    }
}

fn count(body: &serde_json::Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match number(body, key)? {
        None => Ok(None),
        Some(v) if v >= 0.0 && v.fract() == 0.0 && v <= u32::MAX as f64 => Ok(Some(v as usize)),
        Some(_) => {
            Err(ApiError::bad_request(format!("'{key}' must be a non-negative integer")).param(key))
        }
    }
}

fn flag(body: &serde_json::Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(format!("'{key}' must be a boolean")).param(key)),
    }
}

/// The request's model must be the served one (or absent).
pub fn check_model(s: &Shared, body: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if *m == s.config.name => Ok(()),
        Some(Value::String(m)) => Err(ApiError::not_found(
            format!(
                "The model '{m}' does not exist; this server serves '{}'",
                s.config.name
            ),
            "model_not_found",
        )
        .param("model")),
        Some(_) => Err(ApiError::bad_request("'model' must be a string").param("model")),
    }
}

/// Fields common to chat, completions and responses.
pub struct Common {
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: Option<usize>,
}

/// Builds the engine request and checks it against the window.
pub fn generate_request(
    s: &Shared,
    body: &serde_json::Map<String, Value>,
    prompt: Vec<u32>,
    max_tokens_keys: &[&str],
) -> Result<(GenerateRequest, Common), ApiError> {
    if let Some(n) = count(body, "n")? {
        if n != 1 {
            return Err(ApiError::bad_request("only n = 1 is supported").param("n"));
        }
    }
    let d = &s.config.sampling;
    let sampling = SamplingParams {
        temperature: number(body, "temperature")?.map_or(d.temperature, |v| v as f32),
        top_k: count(body, "top_k")?.filter(|&k| k > 0).or(d.top_k),
        top_p: number(body, "top_p")?.map_or(d.top_p, |v| v as f32),
        min_p: number(body, "min_p")?.map_or(d.min_p, |v| v as f32),
        seed: match body.get("seed") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => n.as_u64().or(n.as_i64().map(|v| v as u64)),
            Some(_) => return Err(ApiError::bad_request("'seed' must be an integer").param("seed")),
        },
    };
    sampling.validate().map_err(ApiError::bad_request)?;
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(st)) => vec![st.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::bad_request("'stop' must be a string or a list of strings").param("stop")
            })?,
        Some(_) => {
            return Err(
                ApiError::bad_request("'stop' must be a string or a list of strings").param("stop"),
            )
        }
    };
    let window = s.engine.window();
    if prompt.len() >= window {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {window} tokens. However, your prompt has {} tokens.",
            prompt.len()
        ))
        .code("context_length_exceeded")
        .param("messages"));
    }
    let mut explicit = None;
    for key in max_tokens_keys {
        if let Some(v) = count(body, key)? {
            explicit = Some((v, *key));
        }
    }
    let room = window - prompt.len();
    let max_tokens = match explicit {
        Some((v, key)) if v > room => {
            return Err(ApiError::bad_request(format!(
                "This model's maximum context length is {window} tokens. However, you requested {} tokens \
                 ({} in the prompt, {v} for the reply).",
                prompt.len() + v,
                prompt.len()
            ))
            .code("context_length_exceeded")
            .param(key))
        }
        Some((v, _)) => v,
        None => s.config.max_tokens.min(room),
    };
    let logprobs = match body.get("logprobs") {
        Some(Value::Bool(true)) => Some(count(body, "top_logprobs")?.unwrap_or(0).min(20)),
        Some(Value::Number(n)) => Some(n.as_u64().unwrap_or(0).min(20) as usize),
        _ => None,
    };
    let mut req = GenerateRequest::new(Prompt::Tokens(prompt));
    req.max_tokens = max_tokens;
    req.sampling = sampling;
    req.stop = stop;
    req.ignore_eos = flag(body, "ignore_eos", false)?;
    req.draft = flag(body, "draft", true)?;
    req.cache_prompt = flag(body, "cache_prompt", true)?;
    req.logprobs = logprobs;
    let stream = flag(body, "stream", false)?;
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((
        req,
        Common {
            stream,
            include_usage,
            logprobs,
        },
    ))
}

/// Queues the job or answers 503.
pub fn submit(s: &Shared, req: GenerateRequest) -> Result<UnboundedReceiver<Event>, ApiError> {
    s.worker
        .submit(req, &s.metrics)
        .ok_or_else(|| ApiError::overloaded("the server is at capacity; retry later"))
}

/// Waits for the whole reply. Dropping the future (client gone) closes the
/// channel and cancels generation.
pub async fn collect(mut rx: UnboundedReceiver<Event>) -> Result<Completion, ApiError> {
    while let Some(ev) = rx.recv().await {
        if let Event::Done(r) = ev {
            return r.map_err(ApiError::from);
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

pub fn count_error(s: &Shared) {
    s.metrics.errors.fetch_add(1, Ordering::Relaxed);
}

/// OpenAI usage object.
pub fn usage(c: &Completion) -> Value {
    serde_json::json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
        "completion_tokens_details": {"draft_tokens": c.draft.drafted, "accepted_draft_tokens": c.draft.accepted},
    })
}

pub fn finish_reason(c: &Completion) -> &'static str {
    match c.finish_reason {
        tensorfold_engine::FinishReason::Length => "length",
        _ => "stop",
    }
}
