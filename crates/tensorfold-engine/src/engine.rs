//! Loading, prompt preparation and serial generation.

use crate::sampling::{Sampler, SamplingParams};
use crate::template::ChatTemplate;
use crate::text::TextStream;
use serde::Serialize;
use serde_json::Value as Json;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tensorfold_kv::KvCache;
use tensorfold_models::{Bundle, Logits, Model, ModelError};
use tensorfold_spec::{
    accept, AutoDrafter, ContextConfig, ContextDrafter, DraftModel, DraftStats, Drafter,
};

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
    #[error(transparent)]
    DraftPair(#[from] tensorfold_spec::DraftPairError),
}

/// Which drafter proposes tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterChoice {
    /// Serial decode.
    None,
    /// Context copies only.
    Context,
    /// The draft model only (needs one, see [`Engine::set_draft_model`]).
    Model,
    /// Measure every drafter (and plain rounds) and use what is fastest.
    Auto,
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
    /// `false` gives the serial reference (no drafts), whatever the engine's drafter.
    pub draft: bool,
    /// Return the log-probability of each token and this many alternatives.
    pub logprobs: Option<usize>,
}

impl GenerateRequest {
    pub fn new(prompt: Prompt) -> GenerateRequest {
        GenerateRequest {
            prompt,
            max_tokens: 256,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
            draft: true,
            logprobs: None,
        }
    }
}

/// A generated token's log-probability (under the unfiltered softmax of
/// its verified row) and the most likely alternatives.
#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
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
    pub draft: DraftStats,
    pub logprobs: Vec<TokenLogprob>,
    #[serde(skip)]
    pub prefill_time: Duration,
    #[serde(skip)]
    pub decode_time: Duration,
}

/// Prompt tokens processed per forward while prefilling. Any size gives the
/// same bits; this bounds the workspace.
const PREFILL_CHUNK: usize = 256;

/// Most drafts verified in one round.
const MAX_DEPTH: usize = 8;

/// A loaded model ready to serve requests.
pub struct Engine {
    bundle: Bundle,
    template: Option<ChatTemplate>,
    drafter: DrafterChoice,
    draft_model: Option<Arc<Model>>,
}

impl Engine {
    pub fn load(path: &Path) -> Result<Engine, EngineError> {
        Engine::from_bundle(tensorfold_models::load(path)?)
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
        Ok(Engine {
            bundle,
            template,
            drafter: DrafterChoice::Auto,
            draft_model: None,
        })
    }

    /// Chooses the drafter for requests that allow drafting.
    pub fn set_drafter(&mut self, choice: DrafterChoice) -> Result<(), EngineError> {
        if choice == DrafterChoice::Model && self.draft_model.is_none() {
            return Err(EngineError::Invalid(
                "the model drafter needs a draft model".into(),
            ));
        }
        self.drafter = choice;
        Ok(())
    }

    pub fn drafter(&self) -> DrafterChoice {
        self.drafter
    }

    /// Loads a draft model; refuses one whose tokenizer differs from the target's.
    pub fn set_draft_model(&mut self, path: &Path) -> Result<(), EngineError> {
        let draft = tensorfold_models::load(path)?;
        tensorfold_spec::check_pair(
            &self.bundle.tokenizer.get_vocab(true).into_iter().collect(),
            &draft.tokenizer.get_vocab(true).into_iter().collect(),
        )?;
        self.draft_model = Some(Arc::new(draft.model));
        Ok(())
    }

    fn make_drafter(&self) -> Option<Box<dyn Drafter>> {
        let context =
            || Box::new(ContextDrafter::new(ContextConfig::default())) as Box<dyn Drafter>;
        let model = || {
            self.draft_model
                .as_ref()
                .map(|m| Box::new(DraftModel::new(m.clone())) as Box<dyn Drafter>)
        };
        match self.drafter {
            DrafterChoice::None => None,
            DrafterChoice::Context => Some(context()),
            DrafterChoice::Model => model(),
            DrafterChoice::Auto => {
                let mut arms = vec![context()];
                arms.extend(model());
                Some(Box::new(AutoDrafter::new(arms, &[2, 4, MAX_DEPTH])))
            }
        }
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

    /// Generates a reply. With drafting, each round verifies the pending
    /// token and the drafts in one forward and keeps the drafts the sampler
    /// agrees with; the tokens are those of serial decode. `on_text`
    /// receives each text delta and returns `false` to cancel.
    pub fn generate(
        &self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Completion, EngineError> {
        let prompt = self.prompt_tokens(&req.prompt)?;
        self.check(req, &prompt)?;
        let model = &self.bundle.model;
        let vocab = model.config.vocab_size;
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

        let mut drafter = if req.draft { self.make_drafter() } else { None };
        let mut reply = Reply {
            engine: self,
            req,
            text: TextStream::new(req.stop.clone()),
            context: prompt.clone(),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            budget: req.max_tokens.min(self.window() - prompt.len()),
            finish: None,
        };
        let mut stats = DraftStats::default();
        let mut next = sampler.pick(prompt.len(), &logits);
        let mut next_row = logits;
        while reply.emit(next, &next_row, on_text) {
            let round = Instant::now();
            let room = reply.budget - reply.tokens.len() - 1;
            let drafts = match &mut drafter {
                Some(d) if room > 0 => d.propose(&reply.context, room.min(MAX_DEPTH)),
                _ => Vec::new(),
            };
            let base = cache.len();
            let rows: Vec<u32> = std::iter::once(next)
                .chain(drafts.iter().copied())
                .collect();
            let logits = model.forward(&rows, &mut cache, Logits::All);
            let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
            let (kept, bonus) = accept(&drafts, |i| sampler.pick(base + 1 + i, row(i)));
            cache.truncate(base + 1 + kept);
            if let Some(d) = &mut drafter {
                d.observe(drafts.len(), kept, round.elapsed());
            }
            stats.rounds += 1;
            stats.drafted += drafts.len();
            stats.accepted += kept;
            if !(0..kept).all(|i| reply.emit(drafts[i], row(i), on_text)) {
                break;
            }
            next = bonus;
            next_row = row(kept).to_vec();
        }
        let finish = reply.finish.unwrap_or(FinishReason::Length);
        if finish != FinishReason::Cancelled {
            let rest = reply.text.finish();
            if !rest.is_empty() {
                on_text(&rest);
            }
        }
        Ok(Completion {
            text: reply.text.text().to_string(),
            completion_tokens: reply.tokens.len(),
            tokens: reply.tokens,
            prompt_tokens: prompt.len(),
            finish_reason: finish,
            draft: stats,
            logprobs: reply.logprobs,
            prefill_time,
            decode_time: started.elapsed() - prefill_time,
        })
    }
}

/// A reply being built: tokens are emitted one at a time, in order, and the
/// first that ends it (EOS, stop string, budget, cancel) sets `finish`.
struct Reply<'a> {
    engine: &'a Engine,
    req: &'a GenerateRequest,
    text: TextStream,
    context: Vec<u32>,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    budget: usize,
    finish: Option<FinishReason>,
}

impl Reply<'_> {
    /// Adds `token` (picked from `row`); returns whether the reply goes on.
    fn emit(&mut self, token: u32, row: &[f32], on_text: &mut dyn FnMut(&str) -> bool) -> bool {
        if self.finish.is_some() {
            return false;
        }
        if self.tokens.len() >= self.budget {
            self.finish = Some(FinishReason::Length);
            return false;
        }
        if !self.req.ignore_eos && self.engine.bundle.eos_ids.contains(&token) {
            self.finish = Some(FinishReason::Stop);
            return false;
        }
        self.tokens.push(token);
        self.context.push(token);
        if let Some(n) = self.req.logprobs {
            self.logprobs.push(token_logprob(row, token, n));
        }
        let delta = self.text.push(&self.engine.bundle.tokenizer, token);
        if !delta.text.is_empty() && !on_text(&delta.text) {
            self.finish = Some(FinishReason::Cancelled);
        } else if delta.stopped {
            self.finish = Some(FinishReason::Stop);
        } else if self.tokens.len() >= self.budget {
            self.finish = Some(FinishReason::Length);
        }
        self.finish.is_none()
    }
}

/// Log-softmax of `row` at `token`, and the `n` most likely tokens.
fn token_logprob(row: &[f32], token: u32, n: usize) -> TokenLogprob {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = |t: u32| (row[t as usize] as f64 - lse) as f32;
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    let n = n.min(ids.len());
    if n > 0 {
        ids.select_nth_unstable_by(n - 1, |&a, &b| {
            row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
        });
    }
    let mut top: Vec<(u32, f32)> = ids[..n].iter().map(|&t| (t, lp(t))).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    TokenLogprob {
        token,
        logprob: lp(token),
        top,
    }
}
