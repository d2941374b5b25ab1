//! The Anthropic Messages API: `POST /v1/messages` (system, content
//! blocks, tools with `tool_use`/`tool_result`, `stop_sequences`, thinking,
//! streaming events in Anthropic's order) and
//! `POST /v1/messages/count_tokens`, with errors in Anthropic's shape.

use crate::body::{
    parse, AnthropicToolChoice, Block, BlockContent, ConversationRole, Generation, MessagesBody,
    OneOrMany, SystemPrompt, ThinkingConfig, ToolResultContent,
};
use crate::chat::safe_prefix;
use crate::error::ApiError;
use crate::reasoning::{self, ThinkSplit};
use crate::request::{collect, count_error, generate_request, prompt_ids, submit, LengthField};
use crate::tools;
use crate::worker::Event;
use crate::{request_id, Shared};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use tensorfold_engine::{Completion, Engine, FinishReason, Prompt, ThinkingBudget};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// An error in Anthropic's shape.
fn anthropic_error(e: &ApiError) -> Value {
    let kind = match e.status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    };
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn respond_error(s: &Shared, e: ApiError) -> Response {
    count_error(s);
    (e.status, Json(anthropic_error(&e))).into_response()
}

/// Text of blocks that must be text (system, tool results).
fn block_text(blocks: &[Block], field: &str) -> Result<String, ApiError> {
    blocks
        .iter()
        .map(|b| match b {
            Block::Text { text } => Ok(text.as_str()),
            _ => Err(ApiError::bad_request("only text blocks are supported here").param(field)),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|v| v.join(""))
}

/// Anthropic's conversation as the chat messages templates expect:
/// `tool_use` blocks become the assistant's tool calls, `tool_result`
/// blocks `tool` messages.
fn conversation(body: &MessagesBody) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    match &body.system {
        Some(SystemPrompt::Text(t)) => out.push(json!({"role": "system", "content": t})),
        Some(SystemPrompt::Blocks(b)) => {
            out.push(json!({"role": "system", "content": block_text(b, "system")?}))
        }
        None => {}
    }
    if body.messages.is_empty() {
        return Err(
            ApiError::bad_request("messages: at least one message is required").param("messages"),
        );
    }
    for (i, m) in body.messages.iter().enumerate() {
        let role = match m.role {
            ConversationRole::User => "user",
            ConversationRole::Assistant => "assistant",
        };
        let blocks = match &m.content {
            BlockContent::Text(t) => {
                out.push(json!({"role": role, "content": t}));
                continue;
            }
            BlockContent::Blocks(b) => b,
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let field = format!("messages.{i}.content.{j}");
            match b {
                Block::Text { text: t } => text.push_str(t),
                Block::ToolUse { id, name, input } => calls.push(json!({
                    "id": id, "type": "function", "function": {"name": name, "arguments": input},
                })),
                Block::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } => {
                    let mut result = match content {
                        None => String::new(),
                        Some(ToolResultContent::Text(t)) => t.clone(),
                        Some(ToolResultContent::Blocks(b)) => block_text(b, &field)?,
                    };
                    if *is_error == Some(true) {
                        result = format!("Error: {result}");
                    }
                    out.push(
                        json!({"role": "tool", "tool_call_id": tool_use_id, "content": result}),
                    );
                }
                Block::Thinking {} | Block::RedactedThinking {} => {}
                Block::Image {} | Block::Document {} => {
                    return Err(ApiError::bad_request(
                        "only text, tool_use and tool_result blocks are supported",
                    )
                    .param(&field))
                }
            }
        }
        if !text.is_empty() || !calls.is_empty() {
            let mut message = json!({"role": role, "content": text});
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls);
            }
            out.push(message);
        }
    }
    Ok(out)
}

/// The tools offered to the template (OpenAI's function shape), as
/// `tool_choice` narrows them.
fn offered_tools(body: &MessagesBody) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = &body.tools else {
        return Ok(None);
    };
    let mut tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.input_schema,
            }})
        })
        .collect();
    match &body.tool_choice {
        Some(AnthropicToolChoice::None {}) => return Ok(None),
        Some(AnthropicToolChoice::Tool { name }) => {
            tools.retain(|t| t["function"]["name"] == name.as_str());
            if tools.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "tool_choice names unknown tool '{name}'"
                ))
                .param("tool_choice"));
            }
        }
        _ => {}
    }
    Ok(Some(tools))
}

fn prompt_of(body: &MessagesBody, tools: &Option<Vec<Value>>) -> Result<Prompt, ApiError> {
    let mut vars = Map::new();
    if let Some(t) = tools {
        vars.insert("tools".into(), Value::Array(t.clone()));
    }
    if let Some(thinking) = &body.thinking {
        let on = matches!(thinking, ThinkingConfig::Enabled { .. });
        vars.insert("enable_thinking".into(), json!(on));
    }
    Ok(Prompt::Chat {
        messages: conversation(body)?,
        template_vars: vars,
    })
}

/// `POST /v1/messages/count_tokens`.
pub async fn count_tokens(State(s): State<Shared>, body: Bytes) -> Response {
    let result = async {
        let body: MessagesBody = parse(&body)?;
        let tools = offered_tools(&body)?;
        let prompt = prompt_of(&body, &tools)?;
        let ids = prompt_ids(&s, prompt, false).await?;
        Ok(Json(json!({"input_tokens": ids.ids.len()})).into_response())
    };
    result.await.unwrap_or_else(|e| respond_error(&s, e))
}

/// What a finished reply says, in blocks.
struct Reply {
    thinking: Option<String>,
    text: String,
    calls: Vec<Value>,
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

struct Call {
    tools: Option<Vec<Value>>,
    reasoning: Option<bool>,
    stops: Vec<String>,
}

impl Call {
    fn reply(&self, engine: &Engine, c: &Completion) -> Reply {
        let (thinking, answer) = match self.reasoning {
            Some(inside) => {
                let p = ThinkSplit::split(&c.text, inside);
                (Some(p.reasoning).filter(|r| !r.is_empty()), p.content)
            }
            None => (None, c.text.clone()),
        };
        let (text, calls) = match &self.tools {
            Some(tools) => {
                let offered: Vec<&str> = tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str())
                    .collect();
                let (rest, calls) = tools::parse(&answer, &offered);
                let calls: Vec<Value> = calls
                    .iter()
                    .map(|call| {
                        let schema = tools
                            .iter()
                            .find(|t| t["function"]["name"] == call.name.as_str())
                            .map(|t| t["function"]["parameters"].clone())
                            .unwrap_or(Value::Null);
                        json!({"type": "tool_use", "id": request_id("toolu"), "name": call.name,
                               "input": tools::type_arguments(&call.arguments, &schema)})
                    })
                    .collect();
                (if calls.is_empty() { answer } else { rest }, calls)
            }
            None => (answer, Vec::new()),
        };
        let stop_sequence = self.matched_stop(engine, c);
        let stop_reason = if !calls.is_empty() {
            "tool_use"
        } else if c.finish_reason == FinishReason::Length {
            "max_tokens"
        } else if stop_sequence.is_some() {
            "stop_sequence"
        } else {
            "end_turn"
        };
        Reply {
            thinking,
            text,
            calls,
            stop_reason,
            stop_sequence,
        }
    }

    /// The stop sequence that ended the reply: the generated tokens spell
    /// the reply's text and then it.
    fn matched_stop(&self, engine: &Engine, c: &Completion) -> Option<String> {
        if c.finish_reason != FinishReason::Stop || self.stops.is_empty() {
            return None;
        }
        let spelled = engine.decode(&c.tokens);
        let rest = spelled.strip_prefix(c.text.as_str())?;
        self.stops
            .iter()
            .find(|s| rest.starts_with(s.as_str()))
            .cloned()
    }
}

fn usage(c: &Completion) -> Value {
    json!({
        "input_tokens": c.prompt_tokens - c.cached_tokens,
        "output_tokens": c.completion_tokens,
        "cache_read_input_tokens": c.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// `POST /v1/messages`.
pub async fn messages(State(s): State<Shared>, body: Bytes) -> Response {
    s.metrics
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match create(&s, &body).await {
        Ok(r) => r,
        Err(e) => respond_error(&s, e),
    }
}

async fn create(s: &Shared, body: &[u8]) -> Result<Response, ApiError> {
    let body: MessagesBody = parse(body)?;
    let Some(max_tokens) = body.max_tokens else {
        return Err(ApiError::bad_request("max_tokens: field required").param("max_tokens"));
    };
    let tools = offered_tools(&body)?;
    let prompt = prompt_of(&body, &tools)?;
    let reuse = body.cache_prompt.unwrap_or(true);
    let ids = prompt_ids(s, prompt, reuse).await?;
    let reasoning = reasoning::channel(&s.engine, &ids.ids, None);
    let generation = Generation {
        temperature: body.temperature,
        top_p: body.top_p,
        top_k: body.top_k,
        seed: body.seed,
        stop: body.stop_sequences.clone().map(OneOrMany::Many),
        max_tokens: Some(max_tokens),
        draft: body.draft,
        cache_prompt: body.cache_prompt,
        ..Generation::default()
    };
    let prompt_len = ids.ids.len();
    let (mut req, _) = generate_request(s, &generation, ids, LengthField::Plain)?;
    if let (
        Some(ThinkingConfig::Enabled {
            budget_tokens: Some(tokens),
        }),
        Some(inside),
    ) = (&body.thinking, reasoning)
    {
        req.thinking_budget = Some(ThinkingBudget::new(&s.engine, *tokens as usize, inside)?);
    }
    let call = Call {
        tools,
        reasoning,
        stops: req.stop.clone(),
    };
    let rx = submit(s, req)?;
    let id = request_id("msg");
    // Anthropic clients name their own models (Claude Code does): any
    // name is the served model, echoed back.
    let model = body.model.clone().unwrap_or_else(|| s.config.name.clone());
    if body.stream != Some(true) {
        let c = collect(rx).await?;
        let reply = call.reply(&s.engine, &c);
        let mut content = Vec::new();
        if let Some(t) = reply.thinking {
            content.push(json!({"type": "thinking", "thinking": t, "signature": ""}));
        }
        if !reply.text.is_empty() || reply.calls.is_empty() {
            content.push(json!({"type": "text", "text": reply.text}));
        }
        content.extend(reply.calls);
        return Ok(Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence,
            "usage": usage(&c),
        }))
        .into_response());
    }
    let engine = s.engine.clone();
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": prompt_len, "output_tokens": 0},
    }});
    let mut events = EventStream::new(call.reasoning, call.tools.is_some());
    let opening = futures_util::stream::iter(vec![sse(&start), sse(&json!({"type": "ping"}))]);
    let stream = UnboundedReceiverStream::new(rx).flat_map(move |ev| {
        let out = match ev {
            Event::Delta(d) => events.delta(&d),
            Event::Done(Err(e)) => vec![anthropic_error(&ApiError::from(e))],
            Event::Done(Ok(c)) => events.finish(&call.reply(&engine, &c), &c),
        };
        futures_util::stream::iter(out.into_iter().map(|v| sse(&v)))
    });
    Ok(Sse::new(opening.chain(stream)).into_response())
}

fn sse(v: &Value) -> Result<SseEvent, Infallible> {
    let kind = v["type"].as_str().unwrap_or("message");
    Ok(SseEvent::default().event(kind).data(v.to_string()))
}

/// Streaming state: which content block is open, and the text sent.
struct EventStream {
    split: Option<ThinkSplit>,
    watch_tools: bool,
    /// The open block's index and type.
    open: Option<(usize, &'static str)>,
    blocks: usize,
    text: String,
    sent: usize,
}

impl EventStream {
    fn new(reasoning: Option<bool>, watch_tools: bool) -> EventStream {
        EventStream {
            split: reasoning.map(ThinkSplit::new),
            watch_tools,
            open: None,
            blocks: 0,
            text: String::new(),
            sent: 0,
        }
    }

    /// Opens a block of `kind` unless one is open; closes another kind.
    fn block(&mut self, kind: &'static str, start: Value, out: &mut Vec<Value>) -> usize {
        match self.open {
            Some((i, k)) if k == kind => return i,
            Some((i, _)) => out.push(json!({"type": "content_block_stop", "index": i})),
            None => {}
        }
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((index, kind));
        out.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        index
    }

    fn thinking(&mut self, t: &str, out: &mut Vec<Value>) {
        if t.is_empty() {
            return;
        }
        let i = self.block("thinking", json!({"type": "thinking", "thinking": ""}), out);
        out.push(json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "thinking_delta", "thinking": t}}));
    }

    fn send_text(&mut self, upto: usize, out: &mut Vec<Value>) {
        if upto <= self.sent {
            return;
        }
        let i = self.block("text", json!({"type": "text", "text": ""}), out);
        out.push(json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "text_delta", "text": &self.text[self.sent..upto]}}));
        self.sent = upto;
    }

    fn answer_of(&mut self, delta: &str, finished: bool, out: &mut Vec<Value>) -> String {
        let Some(split) = &mut self.split else {
            return delta.to_string();
        };
        let parts = split.take(delta, finished);
        self.thinking(&parts.reasoning, out);
        parts.content
    }

    fn delta(&mut self, delta: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let answer = self.answer_of(delta, false, &mut out);
        self.text.push_str(&answer);
        let safe = if self.watch_tools {
            safe_prefix(&self.text)
        } else {
            self.text.len()
        };
        self.send_text(safe, &mut out);
        out
    }

    fn finish(&mut self, reply: &Reply, c: &Completion) -> Vec<Value> {
        let mut out = Vec::new();
        let rest = self.answer_of("", true, &mut out);
        self.text.push_str(&rest);
        if reply.text.len() > self.sent && reply.text.starts_with(&self.text[..self.sent]) {
            self.text = reply.text.clone();
            self.send_text(reply.text.len(), &mut out);
        }
        if self.blocks == 0 && reply.calls.is_empty() {
            self.block("text", json!({"type": "text", "text": ""}), &mut out);
        }
        if let Some((i, _)) = self.open.take() {
            out.push(json!({"type": "content_block_stop", "index": i}));
        }
        for call in &reply.calls {
            let index = self.blocks;
            self.blocks += 1;
            out.push(
                json!({"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": call["id"], "name": call["name"], "input": {},
                }}),
            );
            let input = call["input"].to_string();
            for piece in fragments(&input, 24) {
                out.push(json!({"type": "content_block_delta", "index": index,
                                "delta": {"type": "input_json_delta", "partial_json": piece}}));
            }
            out.push(json!({"type": "content_block_stop", "index": index}));
        }
        out.push(json!({"type": "message_delta",
                        "delta": {"stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence},
                        "usage": {"output_tokens": c.completion_tokens}}));
        out.push(json!({"type": "message_stop"}));
        out
    }
}

/// `text` in pieces of about `size` bytes, cut at character boundaries.
pub fn fragments(text: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(size);
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out
}
