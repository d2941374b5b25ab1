//! Command-line arguments.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "tensorfold",
    version,
    about = "Exact speculative decoding for language models"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Generate a reply to one prompt; the reply alone goes to stdout.
    Run(RunArgs),
    /// Print a model's architecture, sizes and quant types from its header.
    Info(InfoArgs),
    /// Serve the OpenAI API over HTTP.
    Serve(ServeArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    /// A GGUF file or Hugging Face directory; default: SmolLM2 in models/,
    /// fetched if missing.
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The model id clients use (default: the file name).
    #[arg(long)]
    pub name: Option<String>,
    /// Reply length when a request sets none.
    #[arg(long, default_value_t = 1024)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Require `Authorization: Bearer KEY`.
    #[arg(long, env = "TENSORFOLD_API_KEY")]
    pub api_key: Option<String>,
    /// Largest request body accepted.
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Requests that may wait before new ones get 503.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
}

/// Sampling flags shared by commands that generate.
#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// 0 is greedy.
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub min_p: Option<f32>,
    #[arg(long)]
    pub seed: Option<u64>,
}

/// Drafting flags shared by commands that generate.
#[derive(Args, Clone)]
pub struct DraftArgs {
    /// `auto`, `none`, `context`, or the path of a draft model sharing the
    /// target's tokenizer.
    #[arg(long, default_value = "auto")]
    pub drafter: String,
    /// A draft model for `--drafter auto` to consider beside context copies.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Serial decode: the reference every drafted reply equals.
    #[arg(long)]
    pub no_drafts: bool,
}

#[derive(Args)]
pub struct RunArgs {
    /// A GGUF file or a Hugging Face model directory.
    pub model: PathBuf,
    #[arg(long)]
    pub prompt: String,
    /// Apply the model's chat template to the prompt as a user message.
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop string (repeatable); it is removed from the reply.
    #[arg(long)]
    pub stop: Vec<String>,
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub draft: DraftArgs,
}

#[derive(Args)]
pub struct InfoArgs {
    pub model: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}
