//! The engine other Rust programs embed: load a model, turn a prompt (raw
//! text or chat messages) into tokens, and generate with keyed sampling,
//! stop strings and streaming text.
//!
//! ```no_run
//! use tensorfold_engine::{Engine, GenerateRequest, Prompt};
//! let engine = Engine::load("models/smollm2-135m-instruct-q4_1.gguf".as_ref())?;
//! let mut req = GenerateRequest::new(Prompt::chat_user("Name the capital of France."));
//! req.max_tokens = 32;
//! let out = engine.generate(&req, &mut |delta| { print!("{delta}"); true })?;
//! eprintln!("{} tokens", out.completion_tokens);
//! # Ok::<(), tensorfold_engine::EngineError>(())
//! ```

mod backend;
mod batch;
mod draft_model;
mod engine;
mod grammar;
mod prefix;
mod reply;
mod sampling;
mod template;
mod text;
mod thinking;

pub use backend::{cuda_available, BackendChoice, DeviceCache};
pub use batch::Batch;
pub use draft_model::{check_pair, DraftModel, DraftPairError};
pub use engine::{
    Completion, DrafterChoice, Engine, EngineError, FinishReason, GenerateRequest, Parallel,
    Prepared, Prompt, TokenLogprob, AUTO_MAX_STREAMS, DEFAULT_CHECKPOINT_SLOTS,
    DEFAULT_DECODE_SHARE, GPU_DECODE_ROWS,
};
pub use grammar::{Grammar, GrammarSpec};
pub use prefix::{HeldSpans, PromptIds, MIN_REUSE};
pub use reply::OnText;
pub use sampling::{argmax, prompt_seed, Pick, Sampler, SamplingParams};
pub use template::ChatTemplate;
pub use tensorfold_models as models;
pub use tensorfold_scheduler::{memory, StreamId};
pub use tensorfold_spec::DraftStats;
pub use text::{Delta, TextStream};
pub use thinking::ThinkingBudget;
