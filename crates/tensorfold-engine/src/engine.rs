//! Loading, prompt preparation and serial generation.

use crate::sampling::{Sampler, SamplingParams};
use crate::template::ChatTemplate;
use crate::text::TextStream;
use serde::Serialize;
use serde_json::Value as Json;
use std::path::Path;
use std::time::{Duration, Instant};
use tensorfold_kv::KvCache;
use tensorfold_models::{Bundle, Logits, ModelError};

/// Why a request could not be served.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The request itself is wrong (bad parameter, template error).
    #[error("{0}")]
    Invalid(String),
    #[error("prompt has {prompt} tokens; the context window is {window}")]
    ContextLength { prompt: usize, window: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// What to continue from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Raw text, no template.
    Text(String),
    /// Chat messages (OpenAI-shaped JSON) rendered with the model's template.
    Chat {
        messages: Vec<Json>,
        /// Extra template variables (`tools`, `reasoning_effort`, kwargs).
        template_vars: serde_json::Map<String, Json>,
    },
    /// Already tokenized.
    Tokens(Vec<u32>),
}

impl Prompt {
    pub fn chat_user(text: &str) -> Prompt {
        Prompt::Chat {
            messages: vec![serde_json::json!({"role": "user", "content": text})],
            template_vars: Default::default(),
        }
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
}

impl GenerateRequest {
    pub fn new(prompt: Prompt) -> GenerateRequest {
        GenerateRequest {
            prompt,
            max_tokens: 256,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The caller stopped listening.
    Cancelled,
}

/// The result of a request.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub text: String,
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub finish_reason: FinishReason,
    #[serde(skip)]
    pub prefill_time: Duration,
    #[serde(skip)]
    pub decode_time: Duration,
}

/// Prompt tokens processed per forward while prefilling. Any size gives the
/// same bits; this bounds the workspace.
const PREFILL_CHUNK: usize = 256;

/// A loaded model ready to serve requests.
pub struct Engine {
    bundle: Bundle,
    template: Option<ChatTemplate>,
}

impl Engine {
    pub fn load(path: &Path) -> Result<Engine, EngineError> {
        Ok(Engine::from_bundle(tensorfold_models::load(path)?)?)
    }

    pub fn from_bundle(bundle: Bundle) -> Result<Engine, EngineError> {
        let template = match &bundle.chat_template {
            Some(src) => Some(
                ChatTemplate::new(
                    src,
                    bundle.bos_token.as_deref(),
                    bundle.eos_token.as_deref(),
                )
                .map_err(EngineError::Invalid)?,
            ),
            None => None,
        };
        Ok(Engine { bundle, template })
    }

    pub fn bundle(&self) -> &Bundle {
        &self.bundle
    }

    /// The model's context window.
    pub fn window(&self) -> usize {
        self.bundle.model.config.max_positions
    }

    /// Renders a chat prompt to text with the model's template.
    pub fn render_chat(
        &self,
        messages: &[Json],
        vars: &serde_json::Map<String, Json>,
    ) -> Result<String, EngineError> {
        let t = self.template.as_ref().ok_or_else(|| {
            EngineError::Invalid(format!("model {} has no chat template", self.bundle.name))
        })?;
        t.render(messages, true, vars).map_err(EngineError::Invalid)
    }

    /// Tokenizes text; `<|special|>` markers in it are read as their tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let enc = self
            .bundle
            .tokenizer
            .encode(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        let mut ids = enc.get_ids().to_vec();
        if let Some(bos) = self.bundle.add_bos {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        self.bundle.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// The prompt's tokens.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        match prompt {
            Prompt::Text(t) => self.encode(t),
            Prompt::Chat {
                messages,
                template_vars,
            } => self.encode(&self.render_chat(messages, template_vars)?),
            Prompt::Tokens(t) => Ok(t.clone()),
        }
    }

    fn check(&self, req: &GenerateRequest, prompt: &[u32]) -> Result<(), EngineError> {
        req.sampling.validate().map_err(EngineError::Invalid)?;
        let window = self.window();
        if prompt.is_empty() {
            return Err(EngineError::Invalid("prompt is empty".into()));
        }
        if prompt.len() >= window {
            return Err(EngineError::ContextLength {
                prompt: prompt.len(),
                window,
            });
        }
        let vocab = self.bundle.model.config.vocab_size as u32;
        if let Some(t) = prompt.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::Invalid(format!(
                "token {t} is outside the vocabulary of {vocab}"
            )));
        }
        Ok(())
    }

    /// Serial decode: one forward per token. `on_text` receives each text
    /// delta and returns `false` to cancel.
    pub fn generate(
        &self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Completion, EngineError> {
        let prompt = self.prompt_tokens(&req.prompt)?;
        self.check(req, &prompt)?;
        let model = &self.bundle.model;
        let sampler = Sampler::new(req.sampling.clone(), &prompt);
        let started = Instant::now();
        let mut cache = KvCache::new(model.config.kv_shape());
        let mut logits = Vec::new();
        for (i, chunk) in prompt.chunks(PREFILL_CHUNK).enumerate() {
            let last = (i + 1) * PREFILL_CHUNK >= prompt.len();
            logits = model.forward(
                chunk,
                &mut cache,
                if last { Logits::Last } else { Logits::None },
            );
        }
        let prefill_time = started.elapsed();
        let budget = req.max_tokens.min(self.window() - prompt.len());
        let mut text = TextStream::new(req.stop.clone());
        let mut tokens = Vec::new();
        let mut finish = FinishReason::Length;
        while tokens.len() < budget {
            let token = sampler.pick(prompt.len() + tokens.len(), &logits);
            if !req.ignore_eos && self.bundle.eos_ids.contains(&token) {
                finish = FinishReason::Stop;
                break;
            }
            tokens.push(token);
            let delta = text.push(&self.bundle.tokenizer, token);
            if !delta.text.is_empty() && !on_text(&delta.text) {
                finish = FinishReason::Cancelled;
                break;
            }
            if delta.stopped {
                finish = FinishReason::Stop;
                break;
            }
            if tokens.len() < budget {
                logits = model.forward(&[token], &mut cache, Logits::All);
            }
        }
        if finish != FinishReason::Cancelled {
            let rest = text.finish();
            if !rest.is_empty() {
                on_text(&rest);
            }
        }
        Ok(Completion {
            text: text.text().to_string(),
            completion_tokens: tokens.len(),
            tokens,
            prompt_tokens: prompt.len(),
            finish_reason: finish,
            prefill_time,
            decode_time: started.elapsed() - prefill_time,
        })
    }
}
