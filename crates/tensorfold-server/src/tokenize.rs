//! `POST /tokenize` and `POST /detokenize`: the model's tokenizer, with or
//! without the chat template, as llama.cpp's and vLLM's servers offer it.

use crate::body::{parse, DetokenizeBody, TokenizeBody};
use crate::chat::normalize;
use crate::error::ApiError;
use crate::request::blocking;
use crate::Shared;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use tensorfold_engine::Prompt;

pub async fn tokenize(State(s): State<Shared>, body: Bytes) -> Response {
    tokenize_body(&s, &body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn tokenize_body(s: &Shared, body: &[u8]) -> Result<Response, ApiError> {
    let body: TokenizeBody = parse(body)?;
    let prompt = match (body.messages, body.content.or(body.prompt)) {
        (Some(messages), None) => {
            let mut vars = body.chat_template_kwargs.unwrap_or_default();
            if let Some(tools) = body.tools {
                vars.insert("tools".into(), json!(tools));
            }
            vars.insert(
                "add_generation_prompt".into(),
                json!(body.add_generation_prompt.unwrap_or(true)),
            );
            Prompt::Chat {
                messages: normalize(&messages)?,
                template_vars: vars,
            }
        }
        (None, Some(text)) => Prompt::Text(text),
        _ => {
            return Err(ApiError::bad_request(
                "give either 'content' (or 'prompt') text or chat 'messages'",
            ))
        }
    };
    let add_special = body.add_special.unwrap_or(true);
    let with_pieces = body.with_pieces.unwrap_or(false);
    let engine = s.engine.clone();
    let window = engine.window();
    blocking(move || {
        let mut ids = engine.prompt_tokens(&prompt)?;
        if !add_special
            && engine.bundle().add_bos.is_some()
            && ids.first() == engine.bundle().add_bos.as_ref()
        {
            ids.remove(0);
        }
        let tokens: Vec<Value> = if with_pieces {
            ids.iter()
                .map(|&id| json!({"id": id, "piece": engine.decode(&[id])}))
                .collect()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok(
            Json(json!({"tokens": tokens, "count": ids.len(), "max_model_len": window}))
                .into_response(),
        )
    })
    .await
}

pub async fn detokenize(State(s): State<Shared>, body: Bytes) -> Response {
    let result = async {
        let body: DetokenizeBody = parse(&body)?;
        let vocab = s.engine.bundle().model.config.vocab_size as u32;
        if let Some(i) = body.tokens.iter().position(|&t| t >= vocab) {
            return Err(ApiError::bad_request(format!(
                "token {} is outside the vocabulary of {vocab}",
                body.tokens[i]
            ))
            .param(&format!("tokens[{i}]")));
        }
        let engine = s.engine.clone();
        blocking(move || {
            let text = engine.decode(&body.tokens);
            Ok(Json(json!({"content": text, "prompt": text})).into_response())
        })
        .await
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /props`: the window, the model, and the defaults a request gets.
pub async fn props(State(s): State<Shared>) -> Json<Value> {
    let engine = &s.engine;
    let bundle = engine.bundle();
    let d = &s.config.sampling;
    let mut params = Map::new();
    params.insert("temperature".into(), json!(d.temperature));
    params.insert("top_k".into(), json!(d.top_k.unwrap_or(0)));
    params.insert("top_p".into(), json!(d.top_p));
    params.insert("min_p".into(), json!(d.min_p));
    params.insert("max_tokens".into(), json!(s.config.max_tokens));
    Json(json!({
        "model": s.config.name,
        "model_name": bundle.name,
        "window": engine.window(),
        "n_ctx": engine.window(),
        "model_max_positions": bundle.model.config.max_positions,
        "vocab_size": bundle.model.config.vocab_size,
        "total_slots": engine.max_streams(),
        "backend": engine.backend(),
        "chat_template": bundle.chat_template,
        "bos_token": bundle.bos_token,
        "eos_token": bundle.eos_token,
        "default_generation_settings": {"n_ctx": engine.window(), "params": params},
    }))
}
