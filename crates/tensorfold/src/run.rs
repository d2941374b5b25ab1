//! `tensorfold run` and `tensorfold info`.

use crate::cli::{DraftArgs, InfoArgs, RunArgs, SamplingArgs};
use crate::hub;
use anyhow::Result;
use std::io::Write;
use std::path::Path;
use tensorfold_engine::{
    BackendChoice, DrafterChoice, Engine, GenerateRequest, Prompt, SamplingParams,
};
use tensorfold_models::GenerationDefaults;
use tensorfold_progress::Progress;

/// Flags over the model's own defaults over greedy.
pub fn sampling(args: &SamplingArgs, defaults: &GenerationDefaults) -> SamplingParams {
    SamplingParams {
        temperature: args.temperature.or(defaults.temperature).unwrap_or(0.0),
        top_k: args.top_k.or(defaults.top_k).filter(|&k| k > 0),
        top_p: args.top_p.or(defaults.top_p).unwrap_or(1.0),
        min_p: args.min_p.or(defaults.min_p).unwrap_or(0.0),
        seed: args.seed,
    }
}

/// Loads the target and sets up drafting as the flags say.
pub fn load_engine(
    model: &Path,
    draft: &DraftArgs,
    backend: BackendChoice,
    context: Option<usize>,
) -> Result<Engine> {
    let loading = Progress::spinner(format!("loading {}", model.display()));
    let mut engine = match Engine::load(model) {
        Ok(engine) => engine,
        Err(e) => {
            loading.abandon();
            return Err(e.into());
        }
    };
    loading.finish("");
    let device = engine.set_backend(backend)?;
    tracing::info!("model runs on {device}");
    if let Some(p) = &draft.draft_model {
        engine.set_draft_model(&hub::resolve(p)?.0)?;
    }
    let choice = match draft.drafter.as_str() {
        _ if draft.no_drafts => DrafterChoice::None,
        "auto" => DrafterChoice::Auto,
        "none" => DrafterChoice::None,
        "context" => DrafterChoice::Context,
        path => {
            engine.set_draft_model(&hub::resolve(Path::new(path))?.0)?;
            DrafterChoice::Model
        }
    };
    if let Some(device) = engine.draft_backend() {
        tracing::info!("draft model runs on {device}");
    }
    engine.set_drafter(choice)?;
    engine.set_context(context)?;
    Ok(engine)
}

pub fn run(args: RunArgs) -> Result<()> {
    let (model, _) = hub::resolve(&args.model)?;
    let engine = load_engine(&model, &args.draft, args.backend, args.context)?;
    let prompt = if args.chat {
        Prompt::chat_user(&args.prompt)
    } else {
        Prompt::Text(args.prompt.clone())
    };
    let mut req = GenerateRequest::new(prompt);
    req.max_tokens = args.max_tokens;
    req.sampling = sampling(&args.sampling, &engine.bundle().defaults);
    req.stop = args.stop.clone();
    req.ignore_eos = args.ignore_eos;
    let mut stdout = std::io::stdout().lock();
    let out = engine.generate(&req, &mut |delta| {
        let _ = stdout.write_all(delta.as_bytes());
        let _ = stdout.flush();
        true
    })?;
    let _ = writeln!(stdout);
    let decode_s = out.decode_time.as_secs_f64();
    eprintln!(
        "prompt {} tokens in {:.3}s, reply {} tokens in {:.3}s ({:.1} tokens/s), finish: {:?}",
        out.prompt_tokens,
        out.prefill_time.as_secs_f64(),
        out.completion_tokens,
        decode_s,
        out.completion_tokens as f64 / decode_s.max(1e-9),
        out.finish_reason
    );
    eprintln!(
        "drafted {}, accepted {}, rounds {} ({:.2} tokens/round)",
        out.draft.drafted,
        out.draft.accepted,
        out.draft.rounds,
        out.draft.tokens_per_round()
    );
    Ok(())
}

pub fn info(args: InfoArgs) -> Result<()> {
    let info = tensorfold_models::inspect(&hub::resolve(&args.model)?.0)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    let c = &info.config;
    println!("path:          {}", info.path);
    println!("layout:        {}", info.layout);
    println!("architecture:  {}", c.arch.name());
    println!("parameters:    {}", info.parameters);
    println!("weight bytes:  {}", info.weight_bytes);
    println!("vocab:         {}", c.vocab_size);
    println!("hidden:        {}", c.hidden_size);
    println!("intermediate:  {}", c.intermediate_size);
    println!("layers:        {}", c.layers);
    println!(
        "heads:         {} (kv {}, head dim {})",
        c.heads, c.kv_heads, c.head_dim
    );
    println!("context:       {}", c.max_positions);
    println!("tied embed:    {}", c.tied_embeddings);
    let formats: Vec<String> = info
        .formats
        .iter()
        .map(|(f, n)| format!("{f} x{n}"))
        .collect();
    println!("quant types:   {}", formats.join(", "));
    Ok(())
}
