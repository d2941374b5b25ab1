//! `POST /v1/completions`: a raw prompt, no template.

use crate::body::{json_object, typed, CompletionBody, CompletionPrompt, Generation};
use crate::error::ApiError;
use crate::request::{
    check_model, collect, compile_grammar, count_error, finish_reason, generate_request,
    grammar_spec, prompt_ids, submit, usage, LengthField,
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
use tensorfold_engine::{Completion, Engine, Prompt};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// The prompt as the engine takes it: text (so a reply sent back keeps
/// its generated ids) or ids.
fn completion_prompt(prompt: CompletionPrompt) -> Result<Prompt, ApiError> {
    match prompt {
        CompletionPrompt::Text(t) => Ok(Prompt::Text(t)),
        CompletionPrompt::Texts(mut t) if t.len() == 1 => Ok(Prompt::Text(t.remove(0))),
        CompletionPrompt::Tokens(ids) if !ids.is_empty() => Ok(Prompt::Tokens(ids)),
        _ => Err(ApiError::bad_request(
            "'prompt' must be a string, a list of one string, or token ids",
        )
        .param("prompt")),
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
        let value = json_object(&body)?;
        let (body, generation): (CompletionBody, Generation) = (typed(&value)?, typed(&value)?);
        check_model(&s, generation.model.as_deref())?;
        let prompt = completion_prompt(body.prompt)?;
        let prompt = prompt_ids(&s, prompt, generation.cache_prompt.unwrap_or(true)).await?;
        let (mut req, common) = generate_request(&s, &generation, prompt, LengthField::Plain)?;
        compile_grammar(&s, grammar_spec(&generation)?, &mut req).await?;
        let rx = submit(&s, req)?;
        let (id, model, created) = (request_id("cmpl"), s.config.name.clone(), now());
        if !common.stream {
            let c = collect(rx).await?;
            let lp = if common.logprobs.is_some() { legacy_logprobs(&s.engine, &c) } else { Value::Null };
            return Ok(Json(json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": c.text, "finish_reason": finish_reason(&c), "logprobs": lp}],
                "usage": usage(&c, 0),
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
                        u["usage"] = usage(&c, 0);
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
