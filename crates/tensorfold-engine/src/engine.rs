//! Loading, prompt preparation and serial generation.

use crate::backend::{BackendChoice, Device, DeviceCache, PlacedModel, Target};
use crate::batch::Batch;
use crate::draft_model::{check_pair, DraftModel, DraftPairError};
use crate::grammar::{Compiler, Grammar, GrammarSpec};
use crate::prefix::{HeldSpans, PrefixCache, PromptIds};
use crate::sampling::SamplingParams;
use crate::template::ChatTemplate;
use crate::thinking::ThinkingBudget;
use serde::Serialize;
use serde_json::Value as Json;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tensorfold_models::{Bundle, ModelConfig, ModelError};
use tensorfold_scheduler::memory::{self, BudgetError, MemoryBudget};
use tensorfold_scheduler::{MAX_DEPTH, MIN_PREFILL, PREFILL_CHUNK};
use tensorfold_spec::{AutoDrafter, ContextConfig, ContextDrafter, DraftStats, Drafter};

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
    DraftPair(#[from] DraftPairError),
    #[error(transparent)]
    Memory(#[from] BudgetError),
    /// No stream slot or cache memory is free now; try again later.
    #[error("the engine is at capacity")]
    Busy,
    /// The device refused or failed (no GPU, a lost device, out of memory).
    #[error("backend: {0}")]
    Backend(String),
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
    /// Already tokenized by the client: every id is held (the truth for
    /// the text it spells, should that text come back in a later prompt).
    Tokens(Vec<u32>),
    /// Ids as [`Engine::prompt_ids`] made them, with the spans it held.
    Ids(PromptIds),
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
    /// Reuse retained prompt states and retain this one (`false`: neither).
    pub cache_prompt: bool,
    /// What the reply must match ([`Engine::grammar`] compiles it).
    pub grammar: Option<Grammar>,
    /// Reply tokens a `<think>` block may take before it is closed.
    pub thinking_budget: Option<ThinkingBudget>,
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
            cache_prompt: true,
            grammar: None,
            thinking_budget: None,
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
    /// Prompt tokens taken from a retained state instead of prefilled.
    pub cached_tokens: usize,
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

/// Streams `Parallel::Auto` allows at most; memory usually decides first.
pub const AUTO_MAX_STREAMS: usize = 64;

/// How many streams share a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallel {
    /// As many as the memory budget holds, up to [`AUTO_MAX_STREAMS`].
    Auto,
    /// At most this many (at least one).
    Fixed(usize),
}

impl std::str::FromStr for Parallel {
    type Err = String;
    fn from_str(s: &str) -> Result<Parallel, String> {
        match s {
            "auto" => Ok(Parallel::Auto),
            n => match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Parallel::Fixed(n)),
                _ => Err(format!(
                    "--parallel takes `auto` or a positive count, not {n:?}"
                )),
            },
        }
    }
}

/// Retained prompt states kept at most, unless set. Memory bounds them
/// first (retained states give way to live streams); the count only bounds
/// the work of a lookup, and is large enough that a server at its most
/// streams ([`AUTO_MAX_STREAMS`]) keeps every client's last conversation
/// several times over.
pub const DEFAULT_CHECKPOINT_SLOTS: usize = 256;

/// Default share of a round's rows kept by decoding replies while prompts prefill.
pub const DEFAULT_DECODE_SHARE: f64 = 0.5;

/// Decode rows a GPU round holds at most (see [`Engine::decode_rows`]).
pub const GPU_DECODE_ROWS: usize = 64;

/// A loaded model ready to serve requests.
pub struct Engine {
    bundle: Bundle,
    device: Device,
    /// The GPU's total bytes and bytes in use once the weights were on it.
    device_memory: Option<(usize, usize)>,
    template: Option<ChatTemplate>,
    drafter: DrafterChoice,
    /// The draft model, on the target's GPU or on the CPU.
    draft_model: Option<Arc<PlacedModel>>,
    parallel: Parallel,
    decode_share: f64,
    /// The window asked for (`None`: the largest that fits).
    asked_context: Option<usize>,
    /// The memory limit set by the embedder (`None`: the process default).
    memory_limit: Option<usize>,
    /// Resident bytes once the models were loaded: weights and runtime.
    loaded_resident: usize,
    memory: MemoryBudget,
    window: usize,
    /// Retained prompt states; `None` limit: all cache memory not reserved.
    prefix: Mutex<PrefixCache>,
    prompt_cache_limit: Option<usize>,
    checkpoint_slots: usize,
    /// Grammars compile against the vocabulary's token trie, built on first use.
    grammar_compiler: OnceLock<Result<Compiler, String>>,
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
        let mut engine = Engine {
            bundle,
            device: Device::Cpu,
            device_memory: None,
            template,
            drafter: DrafterChoice::Auto,
            draft_model: None,
            parallel: Parallel::Auto,
            decode_share: DEFAULT_DECODE_SHARE,
            asked_context: None,
            memory_limit: None,
            loaded_resident: memory::resident().0,
            memory: MemoryBudget {
                limit: 0,
                fixed: 0,
                per_position: 0,
            },
            window: 0,
            prefix: Mutex::new(PrefixCache::new(0, DEFAULT_CHECKPOINT_SLOTS)),
            prompt_cache_limit: None,
            checkpoint_slots: DEFAULT_CHECKPOINT_SLOTS,
            grammar_compiler: OnceLock::new(),
        };
        engine.size_memory()?;
        Ok(engine)
    }

    /// Recomputes the budget and window: the process's resident memory
    /// once loaded (weights, runtime) plus the forwards' workspaces are
    /// fixed; the rest holds caches (each stream's target and draft caches,
    /// each at its own device's bytes per position).
    fn size_memory(&mut self) -> Result<(), EngineError> {
        let config = &self.bundle.model.config;
        let mut per_position = self.device.cache_bytes_per_position(&self.bundle.model);
        let mut draft_workspace = 0;
        if let Some(d) = &self.draft_model {
            per_position += d.cache_bytes_per_position();
            // A drafter runs one sequence, at most a prefill chunk at a time.
            draft_workspace = workspace_bytes(&d.model.config, PREFILL_CHUNK);
        }
        let rows = PREFILL_CHUNK + self.max_streams() * (1 + MAX_DEPTH);
        // On a GPU the budget is the GPU's memory; the host holds only what
        // the weights took when read.
        let (limit, loaded) = match self.device_memory {
            Some((total, used)) => (memory::limit_of(total), used),
            None => (memory::process_limit(), self.loaded_resident),
        };
        let memory = MemoryBudget {
            limit: match self.memory_limit {
                Some(l) => l,
                None => limit?,
            },
            fixed: loaded + workspace_bytes(config, rows) + draft_workspace,
            per_position,
        };
        let window = memory.window(self.asked_context, config.max_positions)?;
        self.memory = memory;
        self.window = window;
        self.limit_retention();
        Ok(())
    }

    /// Sets the context window: `None` for the largest that fits one request
    /// in the memory budget (capped by the model's). Refuses a window the
    /// model or the budget cannot hold. Returns the window.
    pub fn set_context(&mut self, asked: Option<usize>) -> Result<usize, EngineError> {
        let model_max = self.bundle.model.config.max_positions;
        if let Some(n) = asked {
            if n > model_max {
                return Err(EngineError::Invalid(format!(
                    "--context {n} exceeds the model's window of {model_max} tokens"
                )));
            }
        }
        let before = std::mem::replace(&mut self.asked_context, asked);
        if let Err(e) = self.size_memory() {
            self.asked_context = before;
            return Err(e);
        }
        Ok(self.window)
    }

    /// Moves the target's forward to the device `choice` names (the CPU
    /// unless this is called) and resizes the budget and window for it.
    /// A draft model moves with it (see [`Engine::set_draft_model`]).
    /// Retained prompt states are dropped. Returns the device's name.
    pub fn set_backend(&mut self, choice: BackendChoice) -> Result<String, EngineError> {
        let device = Device::open(choice, &self.bundle.model)?;
        // Placed before the GPU's memory in use is read, so that its
        // weights count as loaded.
        let draft_model = self
            .draft_model
            .as_ref()
            .map(|d| Arc::new(PlacedModel::beside(d.model.clone(), &device)));
        let device_memory = device.device_memory().transpose()?;
        let before = (
            std::mem::replace(&mut self.device, device),
            std::mem::replace(&mut self.device_memory, device_memory),
            std::mem::replace(&mut self.draft_model, draft_model),
        );
        if let Err(e) = self.size_memory() {
            (self.device, self.device_memory, self.draft_model) = before;
            return Err(e);
        }
        *self.prefix_cache() = PrefixCache::new(0, self.checkpoint_slots);
        self.limit_retention();
        Ok(self.device.name())
    }

    /// The device the target runs on: `cpu`, `cuda:N (name)` or `metal`.
    pub fn backend(&self) -> String {
        self.device.name()
    }

    /// Asks the target's device whether it still answers (after a failed
    /// round); the CPU always does.
    pub fn check_device(&self) -> Result<(), EngineError> {
        match self.device.device_memory() {
            Some(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    pub(crate) fn target(&self) -> Target<'_> {
        Target {
            model: &self.bundle.model,
            device: &self.device,
        }
    }

    /// An empty cache on the target's device with room for `positions`.
    pub(crate) fn new_cache(&self, positions: usize) -> Result<DeviceCache, EngineError> {
        self.device.new_cache(&self.bundle.model, positions)
    }

    /// Replaces the process's memory limit (`None`: `TENSORFOLD_MEMORY_LIMIT_GB`
    /// or 70% of RAM) and resizes the window. Returns the window.
    pub fn set_memory_limit(&mut self, bytes: Option<usize>) -> Result<usize, EngineError> {
        let before = std::mem::replace(&mut self.memory_limit, bytes);
        if let Err(e) = self.size_memory() {
            self.memory_limit = before;
            return Err(e);
        }
        Ok(self.window)
    }

    /// Limits retained prompt states: at most `bytes` (`None`: whatever
    /// cache memory the live streams leave) in at most `slots` states
    /// (0 turns retention off).
    pub fn set_prompt_cache(&mut self, bytes: Option<usize>, slots: usize) {
        self.prompt_cache_limit = bytes;
        self.checkpoint_slots = slots;
        self.limit_retention();
    }

    /// Applies the retention limits, within the cache share of the budget.
    fn limit_retention(&self) {
        let bytes = self
            .prompt_cache_limit
            .unwrap_or(usize::MAX)
            .min(self.memory.for_caches());
        self.prefix_cache().set_limits(bytes, self.checkpoint_slots);
    }

    /// Bytes of retained prompt states.
    pub fn prompt_cache_bytes(&self) -> usize {
        self.prefix_cache().bytes()
    }

    pub(crate) fn prefix_cache(&self) -> std::sync::MutexGuard<'_, PrefixCache> {
        // A panic elsewhere cannot leave the entries half-written.
        self.prefix.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_parallel(&mut self, parallel: Parallel) -> Result<(), EngineError> {
        self.parallel = parallel;
        self.size_memory()
    }

    /// Streams one round may hold.
    pub fn max_streams(&self) -> usize {
        match self.parallel {
            Parallel::Auto => AUTO_MAX_STREAMS,
            Parallel::Fixed(n) => n.max(1),
        }
    }

    /// Share of a round's rows that decoding keeps while prompts prefill.
    pub fn set_decode_share(&mut self, share: f64) -> Result<(), EngineError> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(EngineError::Invalid(format!(
                "--decode-share takes a number in (0, 1], not {share}"
            )));
        }
        self.decode_share = share;
        Ok(())
    }

    pub fn decode_share(&self) -> f64 {
        self.decode_share
    }

    /// Fewest prompt rows a round takes while replies decode: on the CPU,
    /// where every row costs about as much as the next, a small share
    /// ([`MIN_PREFILL`]); on a GPU, where a round of hundreds of rows costs a
    /// few times one of a few rows (the weights are read once either way),
    /// a whole chunk.
    pub fn min_prefill(&self) -> usize {
        if self.device.is_gpu() {
            PREFILL_CHUNK
        } else {
            MIN_PREFILL
        }
    }

    /// Most decode rows (pending tokens and drafts) a round holds: on a GPU,
    /// the rows its small-batch forward keeps cheap ([`GPU_DECODE_ROWS`]), so
    /// drafts of many streams never push a round onto the many-row kernels;
    /// unlimited on the CPU, where the drafter weighs each row's cost.
    pub fn decode_rows(&self) -> usize {
        if self.device.is_gpu() {
            GPU_DECODE_ROWS
        } else {
            usize::MAX
        }
    }

    /// The memory budget and how it is spent.
    pub fn memory(&self) -> MemoryBudget {
        self.memory
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

    /// Loads a draft model; refuses one whose tokenizer differs from the
    /// target's. It runs on the target's CUDA GPU when the target is there
    /// and its weights upload (each request's drafter with its own cache on
    /// the GPU), else on the CPU. Call it before serving: the budget counts
    /// the GPU's memory in use once the draft is on it.
    pub fn set_draft_model(&mut self, path: &Path) -> Result<(), EngineError> {
        let draft = tensorfold_models::load(path)?;
        check_pair(
            &self.bundle.tokenizer.get_vocab(true).into_iter().collect(),
            &draft.tokenizer.get_vocab(true).into_iter().collect(),
        )?;
        // The previous draft's weights are released first, so that the
        // memory read below counts only this one's.
        self.draft_model = None;
        let placed = PlacedModel::beside(Arc::new(draft.model), &self.device);
        self.draft_model = Some(Arc::new(placed));
        let sized = self.read_loaded_memory().and_then(|()| self.size_memory());
        if sized.is_err() {
            // The engine serves on without a draft model, sized for that.
            self.draft_model = None;
            if self.read_loaded_memory().is_ok() {
                let _ = self.size_memory();
            }
        }
        sized
    }

    /// Reads what the loaded weights take: the GPU's memory in use on a
    /// GPU, the process's resident memory on the host.
    fn read_loaded_memory(&mut self) -> Result<(), EngineError> {
        self.device_memory = self.device.device_memory().transpose()?;
        self.loaded_resident = memory::resident().0;
        Ok(())
    }

    /// Where the draft model runs: `cpu` or `cuda:0 (name)`; `None`
    /// without a draft model.
    pub fn draft_backend(&self) -> Option<String> {
        self.draft_model.as_ref().map(|d| d.device.name())
    }

    pub(crate) fn make_drafter(&self) -> Option<Box<dyn Drafter>> {
        let context =
            || Box::new(ContextDrafter::new(ContextConfig::default())) as Box<dyn Drafter>;
        let model = || {
            self.draft_model.as_ref().map(|d| {
                let target_vocab = self.bundle.model.config.vocab_size;
                Box::new(DraftModel::placed(d.clone(), target_vocab)) as Box<dyn Drafter>
            })
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

    /// The context window: what `--context` asked, or the largest that
    /// fits one request in the memory budget, capped by the model's.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Replaces the model's chat template (Jinja source); one that does
    /// not parse is refused and the old one kept.
    pub fn set_chat_template(&mut self, source: &str) -> Result<(), EngineError> {
        let template = ChatTemplate::new(
            source,
            self.bundle.bos_token.as_deref(),
            self.bundle.eos_token.as_deref(),
        )
        .map_err(EngineError::Invalid)?;
        self.template = Some(template);
        self.bundle.chat_template = Some(source.to_string());
        Ok(())
    }

    /// Renders a chat prompt to text with the model's template, ending with
    /// the assistant's turn opened unless `vars` sets
    /// `add_generation_prompt` to `false`.
    pub fn render_chat(
        &self,
        messages: &[Json],
        vars: &serde_json::Map<String, Json>,
    ) -> Result<String, EngineError> {
        let t = self.template.as_ref().ok_or_else(|| {
            EngineError::Invalid(format!("model {} has no chat template", self.bundle.name))
        })?;
        let open = vars
            .get("add_generation_prompt")
            .and_then(Json::as_bool)
            .unwrap_or(true);
        t.render(messages, open, vars).map_err(EngineError::Invalid)
    }

    /// Compiles what a reply must match; a grammar or schema that does not
    /// compile is [`EngineError::Invalid`], naming the problem.
    pub fn grammar(&self, spec: GrammarSpec) -> Result<Grammar, EngineError> {
        match self.grammar_compiler.get_or_init(|| Compiler::new(self)) {
            Ok(compiler) => compiler.compile(spec),
            Err(e) => Err(EngineError::Invalid(e.clone())),
        }
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

    /// The prompt's tokens, as a fresh tokenizer makes them.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        match (self.prompt_text(prompt)?, prompt) {
            (Some(text), _) => self.encode(&text),
            (None, Prompt::Tokens(t)) => Ok(t.clone()),
            (None, Prompt::Ids(p)) => Ok(p.ids.clone()),
            (None, _) => unreachable!("text and chat prompts have text"),
        }
    }

    /// The text a prompt is tokenized from (chat messages rendered);
    /// `None` for a prompt given as tokens.
    fn prompt_text(&self, prompt: &Prompt) -> Result<Option<String>, EngineError> {
        Ok(match prompt {
            Prompt::Text(t) => Some(t.clone()),
            Prompt::Chat {
                messages,
                template_vars,
            } => Some(self.render_chat(messages, template_vars)?),
            Prompt::Tokens(_) | Prompt::Ids(_) => None,
        })
    }

    /// The ids a retained state holds stay the truth for the text they
    /// spell: when `text` starts with what a retained state's held ids
    /// decode to beyond its common token prefix with `tokens` (a reply the
    /// client sent back, re-rendered into other ids), the prompt keeps the
    /// retained ids for that text and tokenizes only the rest.
    fn keep_generated_ids(
        &self,
        text: &str,
        tokens: &[u32],
    ) -> Result<Option<PromptIds>, EngineError> {
        let tokenizer = &self.bundle.tokenizer;
        let bos = self.bundle.add_bos;
        // The text `ids` spell (a leading BOS is not part of the text).
        let spell = |ids: &[u32]| -> String {
            let ids = match (bos, ids.first()) {
                (Some(b), Some(&f)) if b == f => &ids[1..],
                _ => ids,
            };
            tokenizer.decode(ids, false).unwrap_or_default()
        };
        let Some((mut kept, len)) = self.prefix_cache().longest_spelled(tokens, |ids| {
            let s = spell(ids);
            text.starts_with(&s).then_some(s.len())
        }) else {
            return Ok(None);
        };
        let rest = &text[len..];
        if !rest.is_empty() {
            let enc = tokenizer
                .encode(rest, false)
                .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
            kept.ids.extend_from_slice(enc.get_ids());
        }
        Ok(Some(kept))
    }

    fn check(&self, req: &GenerateRequest, prompt: &[u32]) -> Result<(), EngineError> {
        req.sampling.validate().map_err(EngineError::Invalid)?;
        let window = self.window;
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

    /// The ids a prompt runs as: rendered and tokenized, and with `reuse`
    /// the generated ids of a retained reply kept for the text they spell
    /// (see [`Engine::prepare`]). Front-ends that must count a prompt's
    /// tokens before queueing it call this and pass the ids on as
    /// [`Prompt::Ids`].
    pub fn prompt_ids(&self, prompt: &Prompt, reuse: bool) -> Result<PromptIds, EngineError> {
        let text = match prompt {
            Prompt::Tokens(ids) => {
                return Ok(PromptIds {
                    ids: ids.clone(),
                    held: HeldSpans::all(ids.len()),
                })
            }
            Prompt::Ids(p) => return Ok(p.clone()),
            Prompt::Text(_) | Prompt::Chat { .. } => self.prompt_text(prompt)?.unwrap_or_default(),
        };
        let tokens = self.encode(&text)?;
        if reuse {
            if let Some(kept) = self.keep_generated_ids(&text, &tokens)? {
                return Ok(kept);
            }
        }
        Ok(PromptIds {
            ids: tokens,
            held: HeldSpans::default(),
        })
    }

    /// Tokenizes and checks a request, and sizes what it will hold.
    pub fn prepare(&self, request: GenerateRequest) -> Result<Prepared, EngineError> {
        let PromptIds { ids: tokens, held } =
            self.prompt_ids(&request.prompt, request.cache_prompt)?;
        self.check(&request, &tokens)?;
        let budget = request.max_tokens.min(self.window - tokens.len());
        let cache_bytes = self.memory.stream_bytes(tokens.len() + budget);
        Ok(Prepared {
            request,
            tokens,
            held,
            budget,
            cache_bytes,
        })
    }

    /// A set of streams served together, one shared round per step.
    pub fn batch(&self) -> Batch<'_> {
        Batch::new(self)
    }

    /// Generates a reply: a batch of one, so the same path as concurrent
    /// serving. With drafting, each round verifies the pending token and
    /// the drafts in one forward and keeps the drafts the sampler agrees
    /// with; the tokens are those of serial decode. `on_text` receives each
    /// text delta and returns `false` to cancel.
    pub fn generate(
        &self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Completion, EngineError> {
        let prepared = self.prepare(req.clone())?;
        let mut batch = self.batch();
        batch.admit(prepared, on_text)?;
        loop {
            if let Some((_, done)) = batch.step().pop() {
                return done;
            }
        }
    }
}

/// A checked, tokenized request and what it will reserve.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub(crate) request: GenerateRequest,
    pub(crate) tokens: Vec<u32>,
    /// The prompt's held spans (retained with its state).
    pub(crate) held: HeldSpans,
    /// Reply tokens it may produce: `max_tokens`, within the window.
    pub(crate) budget: usize,
    /// Cache bytes it reserves: prompt and every reply position.
    pub(crate) cache_bytes: usize,
}

impl Prepared {
    pub fn request(&self) -> &GenerateRequest {
        &self.request
    }

    pub fn prompt_tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }
}

/// Activations one forward of `rows` rows may hold at once, logits of every
/// row included (an upper bound: prompt rows keep only the last logits).
fn workspace_bytes(c: &ModelConfig, rows: usize) -> usize {
    let q = c.heads * c.head_dim;
    let kv = c.kv_heads * c.head_dim;
    let per_row = 4 * c.hidden_size + 2 * q + 2 * kv + 3 * c.intermediate_size + c.vocab_size;
    rows * per_row * std::mem::size_of::<f32>()
}
