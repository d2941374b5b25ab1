//! `POST /v1/chat/completions`.

use crate::body::{json_object, typed, ChatBody, Content, Generation, Message, Role, ToolChoice};
use crate::error::ApiError;
use crate::messages::fragments;
use crate::reasoning::{self, ThinkSplit};
use crate::request::{
    check_model, collect, compile_grammar, count_error, finish_reason, generate_request,
    grammar_spec, prompt_ids, submit, usage, LengthField,
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
use tensorfold_engine::{Completion, Engine, Prompt, ThinkingBudget};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Message content as text: a string, or the text parts of a list.
fn content_text(content: &Option<Content>, index: usize) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s.clone()),
        Some(Content::Parts(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| match (p.kind.as_str(), &p.text) {
                ("text" | "input_text" | "output_text", Some(t)) => Ok(t.clone()),
                _ => Err(
                    ApiError::bad_request("only text content parts are supported")
                        .param(&format!("messages[{index}].content[{j}]")),
                ),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.join("")),
    }
}

/// OpenAI messages to what chat templates expect: `developer` becomes
/// `system`, content becomes text, tool-call arguments become objects.
pub fn normalize(messages: &[Message]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("'messages' must be a non-empty list").param("messages"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role {
                Role::System | Role::Developer => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            };
            let mut out = Map::new();
            out.insert("role".into(), json!(role));
            out.insert("content".into(), json!(content_text(&m.content, i)?));
            if let Some(calls) = &m.tool_calls {
                let calls: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        let args = match &c.function.arguments {
                            Value::String(s) => serde_json::from_str(s).unwrap_or(json!({})),
                            Value::Null => json!({}),
                            other => other.clone(),
                        };
                        json!({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
                    })
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            if let Some(name) = &m.name {
                out.insert("name".into(), json!(name));
            }
            if let Some(id) = &m.tool_call_id {
                out.insert("tool_call_id".into(), json!(id));
            }
            Ok(Value::Object(out))
        })
        .collect()
}

/// The tools offered to the template, as `tool_choice` narrows them.
fn offered_tools(body: &ChatBody) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = &body.tools else {
        return Ok(None);
    };
    let mut tools: Vec<Value> = tools.iter().map(|t| json!(t)).collect();
    match &body.tool_choice {
        Some(ToolChoice::Mode(c)) if c == "none" => return Ok(None),
        Some(ToolChoice::Named { function }) => {
            tools.retain(|t| t["function"]["name"] == function.name.as_str());
            if tools.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "tool_choice names unknown function '{}'",
                    function.name
                ))
                .param("tool_choice"));
            }
        }
        _ => {}
    }
    Ok(Some(tools))
}

/// A chat prompt: messages and the template's variables (tools, reasoning
/// effort, the request's `chat_template_kwargs`).
pub fn chat_prompt(
    messages: Vec<Value>,
    tools: &Option<Vec<Value>>,
    reasoning_effort: &Option<String>,
    kwargs: &Option<Map<String, Value>>,
) -> Prompt {
    let mut vars = Map::new();
    if let Some(t) = tools {
        vars.insert("tools".into(), Value::Array(t.clone()));
    }
    if let Some(e) = reasoning_effort {
        vars.insert("reasoning_effort".into(), json!(e));
    }
    if let Some(kw) = kwargs {
        for (k, v) in kw {
            vars.insert(k.clone(), v.clone());
        }
    }
    Prompt::Chat {
        messages,
        template_vars: vars,
    }
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
    /// `Some(inside)` when the reply's reasoning is split off; `inside`:
    /// the prompt opened the block.
    reasoning: Option<bool>,
}

impl ChatCall {
    /// The reply's reasoning (if split off) and the rest.
    fn split_reasoning(&self, c: &Completion) -> (Option<String>, String) {
        match self.reasoning {
            Some(inside) => {
                let parts = ThinkSplit::split(&c.text, inside);
                (Some(parts.reasoning), parts.content)
            }
            None => (None, c.text.clone()),
        }
    }

    /// Splits the answer into content and tool calls.
    fn outcome(&self, text: &str) -> (String, Vec<Value>) {
        match &self.tools {
            Some(tools) => {
                let offered: Vec<&str> = tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str())
                    .collect();
                let (rest, calls) = tools::parse(text, &offered);
                let calls = openai_tool_calls(&calls, tools, self.parallel);
                (
                    if calls.is_empty() {
                        text.to_string()
                    } else {
                        rest
                    },
                    calls,
                )
            }
            None => (text.to_string(), Vec::new()),
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
    let value = json_object(body)?;
    let (body, generation): (ChatBody, Generation) = (typed(&value)?, typed(&value)?);
    check_model(&s, generation.model.as_deref())?;
    let messages = normalize(&body.messages)?;
    let tools = offered_tools(&body)?;
    let prompt = chat_prompt(
        messages,
        &tools,
        &body.reasoning_effort,
        &body.chat_template_kwargs,
    );
    let reuse = generation.cache_prompt.unwrap_or(true);
    let prompt = prompt_ids(&s, prompt, reuse).await?;
    let reasoning = reasoning::channel(&s.engine, &prompt.ids, body.reasoning_format.as_deref());
    let (mut req, common) = generate_request(&s, &generation, prompt, LengthField::Chat)?;
    compile_grammar(&s, grammar_spec(&generation)?, &mut req).await?;
    if let (Some(tokens), Some(inside)) = (body.max_thinking_tokens, reasoning) {
        req.thinking_budget = Some(ThinkingBudget::new(&s.engine, tokens as usize, inside)?);
    }
    let call = ChatCall {
        parallel: body.parallel_tool_calls.unwrap_or(true),
        tools,
        reasoning,
    };
    let rx = submit(&s, req)?;
    let id = request_id("chatcmpl");
    let model = s.config.name.clone();
    if !common.stream {
        let c = collect(rx).await?;
        let (thought, answer) = call.split_reasoning(&c);
        let (content, calls) = call.outcome(&answer);
        let mut message = json!({"role": "assistant", "content": content});
        if let Some(r) = thought.as_deref().filter(|r| !r.is_empty()) {
            message["reasoning_content"] = json!(r);
        }
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
            "usage": usage(&c, reasoning::tokens(&s.engine, &c, thought.as_deref())),
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
    let mut split = call.reasoning.map(ThinkSplit::new);
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
        // Reasoning streams as it comes; the answer goes on to the content.
        let mut answer = |delta: &str, finished: bool, out: &mut Vec<Value>| -> String {
            let Some(split) = &mut split else {
                return delta.to_string();
            };
            let parts = split.take(delta, finished);
            if !parts.reasoning.is_empty() {
                out.push(chunk(
                    json!({"reasoning_content": parts.reasoning}),
                    Value::Null,
                    Value::Null,
                ));
            }
            parts.content
        };
        match ev {
            Event::Delta(d) => {
                let d = answer(&d, false, &mut out);
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
                let rest = answer("", true, &mut out);
                text.push_str(&rest);
                let (thought, _) = call.split_reasoning(&c);
                let (content, calls) = call.outcome(&text);
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
                    out.extend(
                        tool_call_deltas(&calls)
                            .into_iter()
                            .map(|d| chunk(json!({"tool_calls": [d]}), Value::Null, Value::Null)),
                    );
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
                    u["usage"] = usage(&c, reasoning::tokens(&engine, &c, thought.as_deref()));
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

/// Tool calls as streaming clients expect them: for each call, a delta
/// with its id and name (empty arguments), then the arguments in fragments.
fn tool_call_deltas(calls: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for call in calls {
        let index = &call["index"];
        out.push(json!({
            "index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }));
        let args = call["function"]["arguments"].as_str().unwrap_or("");
        for piece in fragments(args, 24) {
            out.push(json!({"index": index, "function": {"arguments": piece}}));
        }
    }
    out
}

/// Bytes of `text` that cannot be part of a tool call: everything before a
/// `<tool_call>` tag (or a partial one at the end), and nothing of a reply
/// that starts like a bare call object.
pub(crate) fn safe_prefix(text: &str) -> usize {
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
