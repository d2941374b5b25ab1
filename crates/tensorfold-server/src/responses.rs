//! `/v1/responses`: `input` (text or messages) and `instructions`, answered
//! as one output message; stored (unless `store: false`) so a later request
//! continues it with `previous_response_id`; `GET` and `DELETE` by id;
//! streamed as the Responses API's events.

use crate::body::{json_object, typed, Generation, ResponseInput, ResponsesBody, ResponsesFormat};
use crate::chat::{chat_prompt, normalize};
use crate::error::ApiError;
use crate::request::{
    check_model, collect, compile_grammar, count_error, generate_request, grammar_spec, prompt_ids,
    submit, LengthField,
};
use crate::store::{unknown, Stored};
use crate::worker::Event;
use crate::{now, request_id, Shared};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::convert::Infallible;
use tensorfold_engine::{Completion, FinishReason, GrammarSpec};
use tokio_stream::wrappers::UnboundedReceiverStream;

pub async fn responses(State(s): State<Shared>, body: Bytes) -> Response {
    match respond(&s, &body).await {
        Ok(r) => r,
        Err(e) => {
            count_error(&s);
            e.into_response()
        }
    }
}

/// `GET /v1/responses/{id}`.
pub async fn get_response(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    match s.responses.get(&id) {
        Some(stored) => Json(stored.response).into_response(),
        None => unknown(&id, "id").into_response(),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete_response(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    if s.responses.remove(&id) {
        Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response()
    } else {
        unknown(&id, "id").into_response()
    }
}

/// What one response is, before and after generation.
struct Draft {
    id: String,
    message_id: String,
    created: u64,
    model: String,
    previous: Option<String>,
    store: bool,
    conversation: Vec<Value>,
}

impl Draft {
    fn object(&self, status: &str, text: &str, c: Option<&Completion>) -> Value {
        let output = if status == "in_progress" {
            json!([])
        } else {
            json!([self.item("completed", text)])
        };
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output,
            "previous_response_id": self.previous, "store": self.store,
            "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "usage": c.map(|c| json!({
                "input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens,
                "total_tokens": c.prompt_tokens + c.completion_tokens,
                "input_tokens_details": {"cached_tokens": c.cached_tokens},
                "output_tokens_details": {"reasoning_tokens": 0},
            })),
        })
    }

    fn item(&self, status: &str, text: &str) -> Value {
        json!({
            "type": "message", "id": self.message_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        })
    }

    /// The finished response; stored with its conversation when asked.
    fn finish(&self, s: &Shared, c: &Completion) -> Result<Value, ApiError> {
        let status = if c.finish_reason == FinishReason::Length {
            "incomplete"
        } else {
            "completed"
        };
        let response = self.object(status, &c.text, Some(c));
        if self.store {
            let mut conversation = self.conversation.clone();
            conversation.push(json!({"role": "assistant", "content": c.text}));
            s.responses.insert(
                self.id.clone(),
                Stored {
                    response: response.clone(),
                    conversation,
                },
            )?;
        }
        Ok(response)
    }
}

async fn respond(s: &Shared, body: &[u8]) -> Result<Response, ApiError> {
    s.metrics
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let value = json_object(body)?;
    let (body, generation): (ResponsesBody, Generation) = (typed(&value)?, typed(&value)?);
    check_model(s, generation.model.as_deref())?;
    let store = body.store.unwrap_or(true);
    if store {
        s.responses.check_room()?;
    }
    // A continued conversation starts with the stored one; instructions
    // are not carried over, as OpenAI's API does.
    let mut conversation: Vec<Value> = match &body.previous_response_id {
        Some(id) => {
            s.responses
                .get(id)
                .ok_or_else(|| unknown(id, "previous_response_id"))?
                .conversation
        }
        None => Vec::new(),
    };
    match &body.input {
        ResponseInput::Text(t) => conversation.push(json!({"role": "user", "content": t})),
        ResponseInput::Messages(items) => conversation.extend(normalize(items)?),
    }
    let mut messages = conversation.clone();
    if let Some(i) = &body.instructions {
        messages.retain(|m| m["role"] != "system");
        messages.insert(0, json!({"role": "system", "content": i}));
    }
    let prompt = chat_prompt(
        messages,
        &None,
        &body.reasoning_effort,
        &body.chat_template_kwargs,
    );
    let prompt = prompt_ids(s, prompt, generation.cache_prompt.unwrap_or(true)).await?;
    let (mut req, common) = generate_request(s, &generation, prompt, LengthField::Responses)?;
    let format = match body.text.and_then(|t| t.format) {
        None | Some(ResponsesFormat::Text) => None,
        Some(ResponsesFormat::JsonObject) => Some((GrammarSpec::JsonObject, "text.format")),
        Some(ResponsesFormat::JsonSchema { schema }) => Some((
            schema.map_or(GrammarSpec::JsonObject, GrammarSpec::JsonSchema),
            "text.format",
        )),
    };
    compile_grammar(s, format.or(grammar_spec(&generation)?), &mut req).await?;
    let rx = submit(s, req)?;
    let draft = Draft {
        id: request_id("resp"),
        message_id: request_id("msg"),
        created: now(),
        model: s.config.name.clone(),
        previous: body.previous_response_id.clone(),
        store,
        conversation,
    };
    if !common.stream {
        let c = collect(rx).await?;
        return Ok(Json(draft.finish(s, &c)?).into_response());
    }
    stream(s.clone(), draft, rx)
}

/// The Responses API's events: created, the output item and its text part
/// opened, text deltas, then each closed and the response completed.
fn stream(
    s: Shared,
    draft: Draft,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut sequence = 0u64;
    let mut event = move |mut v: Value| {
        v["sequence_number"] = json!(sequence);
        sequence += 1;
        v
    };
    let opening = vec![
        event(
            json!({"type": "response.created", "response": draft.object("in_progress", "", None)}),
        ),
        event(
            json!({"type": "response.in_progress", "response": draft.object("in_progress", "", None)}),
        ),
        event(
            json!({"type": "response.output_item.added", "output_index": 0,
                     "item": {"type": "message", "id": draft.message_id, "status": "in_progress",
                              "role": "assistant", "content": []}}),
        ),
        event(
            json!({"type": "response.content_part.added", "item_id": draft.message_id,
                     "output_index": 0, "content_index": 0,
                     "part": {"type": "output_text", "text": "", "annotations": []}}),
        ),
    ];
    let item_id = draft.message_id.clone();
    let body = UnboundedReceiverStream::new(rx).flat_map(move |ev| {
        let out = match ev {
            Event::Delta(d) => vec![event(json!({
                "type": "response.output_text.delta", "item_id": item_id, "output_index": 0,
                "content_index": 0, "delta": d, "logprobs": [],
            }))],
            Event::Done(Err(e)) => vec![event(json!({
                "type": "error", "code": ApiError::from(e).code, "message": "generation failed", "param": null,
            }))],
            Event::Done(Ok(c)) => match draft.finish(&s, &c) {
                Ok(response) => {
                    let kind = if response["status"] == "incomplete" {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    vec![
                        event(json!({"type": "response.output_text.done", "item_id": item_id,
                                     "output_index": 0, "content_index": 0, "text": c.text, "logprobs": []})),
                        event(json!({"type": "response.content_part.done", "item_id": item_id,
                                     "output_index": 0, "content_index": 0,
                                     "part": {"type": "output_text", "text": c.text, "annotations": []}})),
                        event(json!({"type": "response.output_item.done", "output_index": 0,
                                     "item": draft.item("completed", &c.text)})),
                        event(json!({"type": kind, "response": response})),
                    ]
                }
                Err(e) => vec![event(json!({"type": "error", "code": e.code, "message": e.message, "param": e.param}))],
            },
        };
        futures_util::stream::iter(out)
    });
    let all = futures_util::stream::iter(opening).chain(body).map(|v| {
        let kind = v["type"].as_str().unwrap_or("message").to_string();
        Ok::<_, Infallible>(SseEvent::default().event(kind).data(v.to_string()))
    });
    Ok(Sse::new(all).into_response())
}
