//! `POST /v1/completions`: a raw prompt, no template.

use crate::error::ApiError;
use crate::request::{
    check_model, collect, count_error, finish_reason, generate_request, parse_body, submit, usage,
};
use crate::worker::Event;
use crate::{now, request_id, Shared};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::convert::Infallible;
use tensorfold_engine::{Completion, Engine};
use tokio_stream::wrappers::UnboundedReceiverStream;

fn prompt_tokens(engine: &Engine, prompt: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::bad_request("'prompt' must be a string, a list of one string, or token ids")
            .param("prompt")
    };
    match prompt {
        Some(Value::String(s)) => Ok(engine.encode(s)?),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(engine.encode(a[0].as_str().unwrap_or(""))?)
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            Ok(a.iter().map(|v| v.as_u64().unwrap_or(0) as u32).collect())
        }
        _ => Err(bad()),
    }
}

fn legacy_logprobs(engine: &Engine, c: &Completion) -> Value {
    let tokens: Vec<String> = c
        .logprobs
        .iter()
        .map(|t| engine.decode(&[t.token]))
        .collect();
    let lps: Vec<f32> = c.logprobs.iter().map(|t| t.logprob).collect();
    let top: Vec<Value> = c
        .logprobs
        .iter()
        .map(|t| {
            Value::Object(
                t.top
                    .iter()
                    .map(|&(id, lp)| (engine.decode(&[id]), json!(lp)))
                    .collect(),
            )
        })
        .collect();
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": []})
}

pub async fn completions(State(s): State<Shared>, body: Bytes) -> Response {
    let result = async {
        s.metrics.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body = parse_body(&body)?;
        check_model(&s, &body)?;
        let prompt = prompt_tokens(&s.engine, body.get("prompt"))?;
        let (req, common) = generate_request(&s, &body, prompt, &["max_tokens"])?;
        let rx = submit(&s, req)?;
        let (id, model, created) = (request_id("cmpl"), s.config.name.clone(), now());
        if !common.stream {
            let c = collect(rx).await?;
            let lp = if common.logprobs.is_some() { legacy_logprobs(&s.engine, &c) } else { Value::Null };
            return Ok(Json(json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": c.text, "finish_reason": finish_reason(&c), "logprobs": lp}],
                "usage": usage(&c),
            }))
            .into_response());
        }
        let include_usage = common.include_usage;
        let chunk = move |text: &str, finish: Value| {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": null}]})
        };
        let stream = UnboundedReceiverStream::new(rx).flat_map(move |ev| {
            let out = match ev {
                Event::Delta(d) => vec![chunk(&d, Value::Null)],
                Event::Done(Err(e)) => vec![ApiError::from(e).body()],
                Event::Done(Ok(c)) => {
                    let mut v = vec![chunk("", json!(finish_reason(&c)))];
                    if include_usage {
                        let mut u = chunk("", Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage(&c);
                        v.push(u);
                    }
                    v
                }
            };
            futures_util::stream::iter(out.into_iter().map(|v| Ok::<_, Infallible>(SseEvent::default().data(v.to_string()))))
        });
        let done = futures_util::stream::once(async { Ok::<_, Infallible>(SseEvent::default().data("[DONE]")) });
        Ok(Sse::new(stream.chain(done)).into_response())
    }
    .await;
    result.unwrap_or_else(|e: ApiError| {
        count_error(&s);
        e.into_response()
    })
}
