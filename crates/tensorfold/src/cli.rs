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
    /// Write a model as an MLX affine checkpoint (Hugging Face layout).
    Quantize(QuantizeArgs),
    /// Write a random-weight GGUF of a real model's shape (for speed comparisons).
    Synth(crate::synth::SynthArgs),
    /// Time prefill and decode as llama-bench does: one JSON line a cell.
    Bench(BenchArgs),
    /// Download models from the Hugging Face Hub into its standard cache.
    Pull(PullArgs),
    /// List local models (the hub cache and the models folder).
    Ls(LsArgs),
    /// Remove models from the hub cache.
    Rm(RmArgs),
}

/// `tensorfold pull REPO[:FILE|:QUANT]...`.
///
/// `REPO` alone takes a safetensors (or MLX) repository's model, or its
/// only GGUF file, or its Q4_K_M one; `:QUANT` (e.g. `:Q4_K_M`) picks the
/// GGUF file of that quant type, `:FILE` a file by name. The format is
/// checked from the headers before the weights are fetched. Honours
/// HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE.
#[derive(Args)]
pub struct PullArgs {
    /// Hub names: owner/name, owner/name:FILE or owner/name:QUANT.
    #[arg(required = true)]
    pub models: Vec<String>,
}

/// `tensorfold ls [--json]`.
#[derive(Args)]
pub struct LsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `tensorfold rm REPO[:FILE|:QUANT]...`: a whole repository, or one file.
#[derive(Args)]
pub struct RmArgs {
    /// Hub names: owner/name (the whole repository) or owner/name:FILE|QUANT.
    #[arg(required = true)]
    pub models: Vec<String>,
}

/// `tensorfold bench MODEL [-p 512,2048] [-n 128] [-d 0,8192] [-r 3]`.
///
/// The cells of llama-bench, on the same kind of input (random token ids):
/// `pp N` prefills N tokens, `tg N` decodes N tokens serially (no drafts)
/// after a context of `-d` tokens. Each cell prints one JSON line.
#[derive(Args)]
pub struct BenchArgs {
    /// A GGUF file or a Hugging Face model directory.
    pub model: PathBuf,
    /// Prompt lengths to prefill (comma-separated; 0 for none).
    #[arg(
        short = 'p',
        long = "prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub prompt: Vec<usize>,
    /// Tokens to decode (comma-separated; 0 for none).
    #[arg(
        short = 'n',
        long = "decode",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub decode: Vec<usize>,
    /// Context depths the decode cells start from (comma-separated).
    #[arg(
        short = 'd',
        long = "depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub depth: Vec<usize>,
    /// Context depths the prefill cells extend (comma-separated): a cell
    /// `pp400@d5000` prefills 400 new tokens after a retained 5000, as a
    /// later turn of a conversation does.
    #[arg(long = "prompt-depth", value_delimiter = ',', default_value = "0")]
    pub prompt_depth: Vec<usize>,
    /// Timed repetitions of each cell, after one untimed warm-up.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Streams sharing one batch (comma-separated): for each count, that
    /// many requests of the first `--prompt` length each decode the first
    /// `--decode` count together, as a server's shared rounds do.
    #[arg(short = 's', long = "streams", value_delimiter = ',')]
    pub streams: Vec<usize>,
    /// Context window in tokens; default: the largest that fits the memory budget.
    #[arg(long)]
    pub context: Option<usize>,
    /// Where the model runs: `auto` (a GPU when there is one), `cpu` or `cuda`.
    #[arg(long, default_value = "auto")]
    pub backend: tensorfold_engine::BackendChoice,
}

/// `tensorfold quantize SRC --bits B --group G --out DIR`.
///
/// Every 2-D weight is quantized by MLX's affine rule (per group: min/max,
/// scale snapped so the larger extreme is exact, round half to even);
/// norms and biases stay f32. The output holds config.json (with the
/// `quantization` block), model.safetensors, tokenizer.json,
/// tokenizer_config.json and generation_config.json.
#[derive(Args)]
pub struct QuantizeArgs {
    /// A GGUF file or f32/f16/bf16 (or MLX) Hugging Face directory.
    pub source: PathBuf,
    /// Bits per weight: 2, 3, 4, 5, 6 or 8.
    #[arg(long, default_value_t = 4)]
    pub bits: u32,
    /// Weights per scale/bias group: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    pub group: usize,
    /// Bits for the token embeddings (model.embed_tokens); default --bits.
    #[arg(long)]
    pub embed_bits: Option<u32>,
    /// Group size for the token embeddings; default --group.
    #[arg(long)]
    pub embed_group: Option<usize>,
    /// Bits for an untied output head (lm_head); default --bits.
    #[arg(long)]
    pub head_bits: Option<u32>,
    /// Group size for an untied output head; default --group.
    #[arg(long)]
    pub head_group: Option<usize>,
    /// Dtype of scales and biases: f16, bf16 or f32.
    #[arg(long, default_value = "f16")]
    pub scale_dtype: String,
    /// How each group's scale and bias are chosen: `search` (least squared
    /// error over a fixed candidate set) or `mlx` (what MLX would write).
    #[arg(long, default_value = "search")]
    pub rule: String,
    /// Output directory (created; existing files are replaced).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Args)]
pub struct ServeArgs {
    /// A GGUF file, a Hugging Face directory or a hub name
    /// (`owner/name[:FILE|:QUANT]`); default: SmolLM2 in models/, fetched
    /// if missing.
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
    /// Responses `/v1/responses` keeps for `previous_response_id`; storing
    /// more is refused until some are deleted.
    #[arg(long, default_value_t = 1024)]
    pub stored_responses: usize,
    /// Streams sharing each round: `auto` (as many as memory holds) or a count.
    #[arg(long, default_value = "auto")]
    pub parallel: tensorfold_engine::Parallel,
    /// Share of a round's rows that running replies keep while prompts prefill.
    #[arg(long, default_value_t = tensorfold_engine::DEFAULT_DECODE_SHARE)]
    pub decode_share: f64,
    /// Context window in tokens; default: the largest that fits one request
    /// in the memory budget (70% of RAM or of GPU memory, or
    /// TENSORFOLD_MEMORY_LIMIT_GB).
    #[arg(long)]
    pub context: Option<usize>,
    /// Where the model runs: `auto` (a GPU when there is one), `cpu` or `cuda`.
    #[arg(long, default_value = "auto")]
    pub backend: tensorfold_engine::BackendChoice,
    /// GiB of retained prompt states for resuming conversations; default:
    /// whatever cache memory running streams leave free.
    #[arg(long)]
    pub prompt_cache_gib: Option<f64>,
    /// Most retained prompt states (0 turns retention off).
    #[arg(long, default_value_t = tensorfold_engine::DEFAULT_CHECKPOINT_SLOTS)]
    pub checkpoint_slots: usize,
    /// A Jinja chat template to use instead of the model's.
    #[arg(long)]
    pub chat_template_file: Option<PathBuf>,
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
    /// A GGUF file, a Hugging Face model directory or a hub name
    /// (`owner/name[:FILE|:QUANT]`, pulled when missing).
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
    /// Context window in tokens; default: the largest that fits the memory budget.
    #[arg(long)]
    pub context: Option<usize>,
    /// Where the model runs: `auto` (a GPU when there is one), `cpu` or `cuda`.
    #[arg(long, default_value = "auto")]
    pub backend: tensorfold_engine::BackendChoice,
}

#[derive(Args)]
pub struct InfoArgs {
    /// A GGUF file, a Hugging Face model directory or a hub name.
    pub model: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}
