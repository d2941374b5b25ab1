//! What every generating route shares: reading the body, the sampling and
//! length fields, the window checks, and running the job.

use crate::body::{Generation, Logprobs, OneOrMany, ResponseFormat, Seed};
use crate::error::ApiError;
use crate::worker::Event;
use crate::Shared;
use serde_json::Value;
use std::sync::atomic::Ordering;
use tensorfold_engine::{
    Completion, GenerateRequest, GrammarSpec, Prompt, PromptIds, SamplingParams,
};
use tokio::sync::mpsc::UnboundedReceiver;

/// The request's model must be the served one (or absent).
pub fn check_model(s: &Shared, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None => Ok(()),
        Some(m) if m == s.config.name => Ok(()),
        Some(m) => Err(ApiError::not_found(
            format!(
                "The model '{m}' does not exist; this server serves '{}'",
                s.config.name
            ),
            "model_not_found",
        )
        .param("model")),
    }
}

/// Fields common to chat, completions and responses.
pub struct Common {
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: Option<usize>,
}

/// Which field sets the reply length on a route.
#[derive(Clone, Copy)]
pub enum LengthField {
    /// `max_tokens` (completions, Anthropic's messages).
    Plain,
    /// Chat: `max_completion_tokens` (or the older `max_tokens`).
    Chat,
    /// Responses: `max_output_tokens`.
    Responses,
}

impl LengthField {
    fn read(self, g: &Generation) -> Option<(usize, &'static str)> {
        let pick = |v: Option<u32>, name| v.map(|v| (v as usize, name));
        match self {
            LengthField::Plain => pick(g.max_tokens, "max_tokens"),
            LengthField::Chat => pick(g.max_completion_tokens, "max_completion_tokens")
                .or(pick(g.max_tokens, "max_tokens")),
            LengthField::Responses => pick(g.max_output_tokens, "max_output_tokens"),
        }
    }
}

/// The prompt's ids as the engine will run them (a retained reply's
/// generated ids kept for the text they spell), rendered and tokenized off
/// the async runtime's threads.
pub async fn prompt_ids(s: &Shared, prompt: Prompt, reuse: bool) -> Result<PromptIds, ApiError> {
    let engine = s.engine.clone();
    blocking(move || engine.prompt_ids(&prompt, reuse).map_err(ApiError::from)).await
}

/// Runs CPU work (rendering, tokenizing, compiling) on the blocking pool.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}

/// Builds the engine request and checks it against the window.
pub fn generate_request(
    s: &Shared,
    g: &Generation,
    prompt: PromptIds,
    length: LengthField,
) -> Result<(GenerateRequest, Common), ApiError> {
    if let Some(n) = g.n {
        if n != 1 {
            return Err(ApiError::bad_request("only n = 1 is supported").param("n"));
        }
    }
    let d = &s.config.sampling;
    let sampling = SamplingParams {
        temperature: g.temperature.unwrap_or(d.temperature),
        top_k: match g.top_k {
            Some(k) => (k > 0).then_some(k as usize),
            None => d.top_k,
        },
        top_p: g.top_p.unwrap_or(d.top_p),
        min_p: g.min_p.unwrap_or(d.min_p),
        seed: g.seed.map(Seed::value),
    };
    sampling.validate().map_err(ApiError::bad_request)?;
    let window = s.engine.window();
    let prompt_len = prompt.ids.len();
    if prompt_len >= window {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {window} tokens. However, your prompt has {prompt_len} tokens.",
        ))
        .code("context_length_exceeded")
        .param("messages"));
    }
    let room = window - prompt_len;
    let max_tokens = match length.read(g) {
        Some((v, key)) if v > room => {
            return Err(ApiError::bad_request(format!(
                "This model's maximum context length is {window} tokens. However, you requested {} tokens \
                 ({} in the prompt, {v} for the reply).",
                prompt_len + v,
                prompt_len
            ))
            .code("context_length_exceeded")
            .param(key))
        }
        Some((v, _)) => v,
        None => s.config.max_tokens.min(room),
    };
    let logprobs = match g.logprobs {
        Some(Logprobs::Flag(true)) => Some(g.top_logprobs.unwrap_or(0).min(20) as usize),
        Some(Logprobs::Count(n)) => Some(n.min(20) as usize),
        _ => None,
    };
    let mut req = GenerateRequest::new(Prompt::Ids(prompt));
    req.max_tokens = max_tokens;
    req.sampling = sampling;
    req.stop = g.stop.clone().map(OneOrMany::into_vec).unwrap_or_default();
    req.ignore_eos = g.ignore_eos.unwrap_or(false);
    req.draft = g.draft.unwrap_or(true);
    req.cache_prompt = g.cache_prompt.unwrap_or(true);
    req.logprobs = logprobs;
    let include_usage = g
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    Ok((
        req,
        Common {
            stream: g.stream.unwrap_or(false),
            include_usage,
            logprobs,
        },
    ))
}

/// The grammar a request's reply must match, if it sets one, and the field
/// that set it.
pub fn grammar_spec(g: &Generation) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
    let mut found: Vec<(GrammarSpec, &'static str)> = Vec::new();
    match &g.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => {
            found.push((GrammarSpec::JsonObject, "response_format"))
        }
        Some(ResponseFormat::JsonSchema { json_schema }) => found.push((
            match &json_schema.schema {
                Some(schema) => GrammarSpec::JsonSchema(schema.clone()),
                None => GrammarSpec::JsonObject,
            },
            "response_format",
        )),
    }
    if let Some(schema) = &g.json_schema {
        found.push((GrammarSpec::JsonSchema(schema.clone()), "json_schema"));
    }
    if let Some(grammar) = &g.grammar {
        found.push((GrammarSpec::Grammar(grammar.clone()), "grammar"));
    }
    if let Some(regex) = &g.regex {
        found.push((GrammarSpec::Regex(regex.clone()), "regex"));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::bad_request(format!(
            "set one of {}, not several",
            found.iter().map(|f| f.1).collect::<Vec<_>>().join(", ")
        ))
        .param(found[1].1)),
    }
}

/// Compiles the grammar off the async threads; one that does not compile
/// is a 400 naming the field and the problem.
pub async fn compile_grammar(
    s: &Shared,
    spec: Option<(GrammarSpec, &'static str)>,
    req: &mut GenerateRequest,
) -> Result<(), ApiError> {
    let Some((spec, field)) = spec else {
        return Ok(());
    };
    let engine = s.engine.clone();
    let grammar = blocking(move || {
        engine
            .grammar(spec)
            .map_err(|e| ApiError::from(e).param(field))
    })
    .await?;
    req.grammar = Some(grammar);
    Ok(())
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

/// OpenAI usage object; `reasoning_tokens` of the reply went to reasoning.
pub fn usage(c: &Completion, reasoning_tokens: usize) -> Value {
    serde_json::json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning_tokens,
            "draft_tokens": c.draft.drafted,
            "accepted_draft_tokens": c.draft.accepted,
        },
    })
}

pub fn finish_reason(c: &Completion) -> &'static str {
    match c.finish_reason {
        tensorfold_engine::FinishReason::Length => "length",
        _ => "stop",
    }
}
