//! `POST /v1/chat/completions` and `POST /v1/responses`.

use crate::error::ApiError;
use crate::request::{
    check_model, collect, count_error, finish_reason, generate_request, parse_body, submit, usage,
};
use crate::tools::{self, ToolCall};
use crate::worker::Event;
use crate::{now, request_id, Shared};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use tensorfold_engine::{Completion, Engine, Prompt};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Message content as text: a string, or the text parts of a list.
fn content_text(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                (Some("text" | "input_text" | "output_text"), Some(t)) => Ok(t.to_string()),
                _ => Err(
                    ApiError::bad_request("only text content parts are supported")
                        .param("messages"),
                ),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.join("")),
        _ => Err(
            ApiError::bad_request("message content must be a string or a list of parts")
                .param("messages"),
        ),
    }
}

/// OpenAI messages to what chat templates expect: `developer` becomes
/// `system`, content becomes text, tool-call arguments become objects.
fn normalize(messages: &Value) -> Result<Vec<Value>, ApiError> {
    let list = messages
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request("'messages' must be a non-empty list").param("messages")
        })?;
    list.iter()
        .map(|m| {
            let role = m["role"]
                .as_str()
                .ok_or_else(|| ApiError::bad_request("each message needs a 'role'").param("messages"))?;
            let role = match role {
                "developer" => "system",
                r @ ("system" | "user" | "assistant" | "tool") => r,
                other => return Err(ApiError::bad_request(format!("unknown role '{other}'")).param("messages")),
            };
            let mut out = Map::new();
            out.insert("role".into(), json!(role));
            out.insert("content".into(), json!(content_text(&m["content"])?));
            if let Some(calls) = m["tool_calls"].as_array() {
                let calls: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        let f = &c["function"];
                        let args = match &f["arguments"] {
                            Value::String(s) => serde_json::from_str(s).unwrap_or(json!({})),
                            other => other.clone(),
                        };
                        json!({"id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": args}})
                    })
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            for key in ["name", "tool_call_id"] {
                if let Some(v) = m.get(key).filter(|v| !v.is_null()) {
                    out.insert(key.into(), v.clone());
                }
            }
            Ok(Value::Object(out))
        })
        .collect()
}

/// The tools offered to the template, as `tool_choice` narrows them.
fn offered_tools(body: &Map<String, Value>) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = body.get("tools").filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let tools = tools
        .as_array()
        .ok_or_else(|| ApiError::bad_request("'tools' must be a list").param("tools"))?;
    let mut tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if t["function"]["parameters"].is_null() {
                t["function"]["parameters"] = json!({"type": "object", "properties": {}});
            }
            t
        })
        .collect();
    match body.get("tool_choice") {
        Some(Value::String(c)) if c == "none" => return Ok(None),
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f["name"].as_str())
                .unwrap_or_default();
            tools.retain(|t| t["function"]["name"] == name);
            if tools.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "tool_choice names unknown function '{name}'"
                ))
                .param("tool_choice"));
            }
        }
        _ => {}
    }
    Ok(Some(tools))
}

/// Renders and tokenizes a chat prompt.
fn chat_prompt(
    engine: &Engine,
    messages: Vec<Value>,
    body: &Map<String, Value>,
    tools: &Option<Vec<Value>>,
) -> Result<Vec<u32>, ApiError> {
    let mut vars = Map::new();
    if let Some(t) = tools {
        vars.insert("tools".into(), Value::Array(t.clone()));
    }
    if let Some(e) = body.get("reasoning_effort").filter(|v| !v.is_null()) {
        vars.insert("reasoning_effort".into(), e.clone());
    }
    if let Some(Value::Object(kw)) = body.get("chat_template_kwargs") {
        for (k, v) in kw {
            vars.insert(k.clone(), v.clone());
        }
    }
    Ok(engine.prompt_tokens(&Prompt::Chat {
        messages,
        template_vars: vars,
    })?)
}

fn openai_tool_calls(calls: &[ToolCall], tools: &[Value], parallel: bool) -> Vec<Value> {
    let take = if parallel {
        calls.len()
    } else {
        calls.len().min(1)
    };
    calls[..take]
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let schema = tools
                .iter()
                .find(|t| t["function"]["name"] == c.name.as_str())
                .map(|t| t["function"]["parameters"].clone())
                .unwrap_or(Value::Null);
            let args = tools::type_arguments(&c.arguments, &schema);
            json!({
                "index": i,
                "id": request_id("call"),
                "type": "function",
                "function": {"name": c.name, "arguments": args.to_string()},
            })
        })
        .collect()
}

fn token_entry(engine: &Engine, id: u32, logprob: f32) -> Value {
    let text = engine.decode(&[id]);
    json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
}

fn chat_logprobs(engine: &Engine, c: &Completion) -> Value {
    let content: Vec<Value> = c
        .logprobs
        .iter()
        .map(|t| {
            let mut e = token_entry(engine, t.token, t.logprob);
            e["top_logprobs"] = Value::Array(
                t.top
                    .iter()
                    .map(|&(id, lp)| token_entry(engine, id, lp))
                    .collect(),
            );
            e
        })
        .collect();
    json!({"content": content})
}

struct ChatCall {
    tools: Option<Vec<Value>>,
    parallel: bool,
}

impl ChatCall {
    /// Splits the reply into content and tool calls.
    fn outcome(&self, c: &Completion) -> (String, Vec<Value>) {
        match &self.tools {
            Some(tools) => {
                let offered: Vec<&str> = tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str())
                    .collect();
                let (text, calls) = tools::parse(&c.text, &offered);
                let calls = openai_tool_calls(&calls, tools, self.parallel);
                (
                    if calls.is_empty() {
                        c.text.clone()
                    } else {
                        text
                    },
                    calls,
                )
            }
            None => (c.text.clone(), Vec::new()),
        }
    }
}

pub async fn chat_completions(State(s): State<Shared>, body: Bytes) -> Response {
    match chat_inner(s.clone(), &body).await {
        Ok(r) => r,
        Err(e) => {
            count_error(&s);
            e.into_response()
        }
    }
}

async fn chat_inner(s: Shared, body: &[u8]) -> Result<Response, ApiError> {
    s.metrics
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let body = parse_body(body)?;
    check_model(&s, &body)?;
    let messages = normalize(body.get("messages").unwrap_or(&Value::Null))?;
    let tools = offered_tools(&body)?;
    let prompt = chat_prompt(&s.engine, messages, &body, &tools)?;
    let (req, common) =
        generate_request(&s, &body, prompt, &["max_tokens", "max_completion_tokens"])?;
    let call = ChatCall {
        parallel: body
            .get("parallel_tool_calls")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        tools,
    };
    let rx = submit(&s, req)?;
    let id = request_id("chatcmpl");
    let model = s.config.name.clone();
    if !common.stream {
        let c = collect(rx).await?;
        let (content, calls) = call.outcome(&c);
        let mut message = json!({"role": "assistant", "content": content});
        let finish = if calls.is_empty() {
            finish_reason(&c)
        } else {
            message["tool_calls"] = Value::Array(calls);
            message["content"] = if content.is_empty() {
                Value::Null
            } else {
                json!(content)
            };
            "tool_calls"
        };
        let logprobs = if common.logprobs.is_some() {
            chat_logprobs(&s.engine, &c)
        } else {
            Value::Null
        };
        return Ok(Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": now(),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}],
            "usage": usage(&c),
        }))
        .into_response());
    }

    // Streaming: content deltas as they come (held back from the first
    // `<tool_call>` on when tools are offered), then tool calls, the finish
    // chunk, usage if asked, and [DONE].
    let engine = s.engine.clone();
    let created = now();
    let chunk = move |delta: Value, finish: Value, logprobs: Value| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
        })
    };
    let mut sent = 0usize;
    let mut text = String::new();
    let mut first = true;
    let watch_tools = call.tools.is_some();
    let include_usage = common.include_usage;
    let want_logprobs = common.logprobs.is_some();
    let stream = UnboundedReceiverStream::new(rx).flat_map(move |ev| {
        let mut out: Vec<Value> = Vec::new();
        if first {
            out.push(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                Value::Null,
            ));
            first = false;
        }
        match ev {
            Event::Delta(d) => {
                text.push_str(&d);
                let safe = if watch_tools {
                    safe_prefix(&text)
                } else {
                    text.len()
                };
                if safe > sent {
                    out.push(chunk(
                        json!({"content": &text[sent..safe]}),
                        Value::Null,
                        Value::Null,
                    ));
                    sent = safe;
                }
            }
            Event::Done(Err(e)) => {
                out.push(ApiError::from(e).body());
            }
            Event::Done(Ok(c)) => {
                let (content, calls) = call.outcome(&c);
                if content.len() > sent && content.starts_with(&text[..sent]) {
                    out.push(chunk(
                        json!({"content": &content[sent..]}),
                        Value::Null,
                        Value::Null,
                    ));
                }
                let finish = if calls.is_empty() {
                    finish_reason(&c)
                } else {
                    out.push(chunk(
                        json!({"tool_calls": calls}),
                        Value::Null,
                        Value::Null,
                    ));
                    "tool_calls"
                };
                let lp = if want_logprobs {
                    chat_logprobs(&engine, &c)
                } else {
                    Value::Null
                };
                out.push(chunk(json!({}), json!(finish), lp));
                if include_usage {
                    let mut u = chunk(json!({}), Value::Null, Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = usage(&c);
                    out.push(u);
                }
            }
        }
        futures_util::stream::iter(
            out.into_iter()
                .map(|v| Ok::<_, Infallible>(SseEvent::default().data(v.to_string()))),
        )
    });
    let done = futures_util::stream::once(async {
        Ok::<_, Infallible>(SseEvent::default().data("[DONE]"))
    });
    Ok(Sse::new(stream.chain(done)).into_response())
}

/// Bytes of `text` that cannot be part of a tool call: everything before a
/// `<tool_call>` tag (or a partial one at the end), and nothing of a reply
/// that starts like a bare call object.
fn safe_prefix(text: &str) -> usize {
    let lead = text.trim_start();
    if lead.is_empty() || lead.starts_with(['{', '[', '`']) {
        return 0;
    }
    if let Some(i) = text.find(tools::OPEN) {
        return i;
    }
    let open = tools::OPEN;
    (1..open.len())
        .rev()
        .find(|&n| text.ends_with(&open[..n]))
        .map_or(text.len(), |n| text.len() - n)
}

/// `POST /v1/responses`: `input` (text or messages) and `instructions`,
/// answered as one output message; not stored.
pub async fn responses(State(s): State<Shared>, body: Bytes) -> Response {
    let result = async {
        s.metrics.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body = parse_body(&body)?;
        check_model(&s, &body)?;
        if body.get("stream").and_then(Value::as_bool) == Some(true) {
            return Err(ApiError::bad_request("streaming is not supported on /v1/responses; use /v1/chat/completions").param("stream"));
        }
        let mut messages = Vec::new();
        if let Some(i) = body.get("instructions").and_then(Value::as_str) {
            messages.push(json!({"role": "system", "content": i}));
        }
        match body.get("input") {
            Some(Value::String(t)) => messages.push(json!({"role": "user", "content": t})),
            Some(Value::Array(items)) => messages.extend(items.iter().cloned()),
            _ => return Err(ApiError::bad_request("'input' must be a string or a list of messages").param("input")),
        }
        let messages = normalize(&Value::Array(messages))?;
        let prompt = chat_prompt(&s.engine, messages, &body, &None)?;
        let (req, _) = generate_request(&s, &body, prompt, &["max_output_tokens"])?;
        let c = collect(submit(&s, req)?).await?;
        let status = if c.finish_reason == tensorfold_engine::FinishReason::Length { "incomplete" } else { "completed" };
        Ok(Json(json!({
            "id": request_id("resp"),
            "object": "response",
            "created_at": now(),
            "status": status,
            "model": s.config.name,
            "output": [{
                "type": "message", "id": request_id("msg"), "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": c.text, "annotations": []}],
            }],
            "usage": {
                "input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens,
                "total_tokens": c.prompt_tokens + c.completion_tokens,
                "input_tokens_details": {"cached_tokens": c.cached_tokens}, "output_tokens_details": {"reasoning_tokens": 0},
            },
        }))
        .into_response())
    }
    .await;
    result.unwrap_or_else(|e| {
        count_error(&s);
        e.into_response()
    })
}
