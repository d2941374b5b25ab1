//! `tensorfold bench`: prefill and decode timed as llama-bench times them,
//! so the two engines can be compared cell for cell on the same file.

use crate::cli::{BenchArgs, DraftArgs};
use anyhow::{bail, Result};
use serde::Serialize;
use std::time::{Duration, Instant};
use tensorfold_engine::{Completion, Engine, GenerateRequest, Prompt};

/// One cell's result, printed as a JSON line.
#[derive(Serialize)]
struct Cell {
    /// `pp512`, `tg128`, `tg128@d8192`, `pp512@d4096`: llama-bench's names.
    test: String,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    backend: String,
    /// Median over the repetitions.
    tokens_per_s: f64,
    samples_tokens_per_s: Vec<f64>,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let no_drafts = DraftArgs {
        drafter: "none".into(),
        draft_model: None,
        no_drafts: true,
    };
    let engine = crate::run::load_engine(&args.model, &no_drafts, args.backend, args.context)?;
    let backend = engine.backend();
    let vocab = engine.bundle().model.config.vocab_size;
    let repetitions = args.repetitions.max(1);
    // One short untimed request: lazy uploads, graph captures, page faults.
    generate(&engine, random_tokens(vocab, 16, 0), 2)?;

    let mut cells = Vec::new();
    for &depth in &args.prompt_depth {
        for &n in args.prompt.iter().filter(|&&n| n > 0) {
            cells.push((cell_name("pp", n, depth), n, 0, depth));
        }
    }
    for &depth in &args.depth {
        for &n in args.decode.iter().filter(|&&n| n > 0) {
            cells.push((cell_name("tg", n, depth), 0, n, depth));
        }
    }
    let mut failed = 0;
    let n_prompt = args.prompt.first().copied().unwrap_or(0).max(1);
    let n_gen = args.decode.first().copied().unwrap_or(0).max(1);
    for &streams in args.streams.iter().filter(|&&s| s > 0) {
        match time_streams(&engine, vocab, streams, n_prompt, n_gen) {
            Ok(cell) => {
                eprintln!(
                    "{:<14} {:>10.1} tokens/s  ({} rounds, median {:.2} ms, slowest {:.2} ms; every first token after {:.2} s)",
                    cell.test,
                    cell.tokens_per_s,
                    cell.rounds,
                    cell.round_ms_median,
                    cell.round_ms_max,
                    cell.first_tokens_s
                );
                println!("{}", serde_json::to_string(&cell)?);
            }
            Err(e) => {
                failed += 1;
                eprintln!("streams {streams:<6} failed: {e:#}");
            }
        }
    }
    for (test, n_prompt, n_gen, n_depth) in cells {
        match time_cell(&engine, vocab, repetitions, n_prompt, n_gen, n_depth) {
            Ok(samples) => {
                let cell = Cell {
                    tokens_per_s: median(&samples),
                    samples_tokens_per_s: samples,
                    test,
                    n_prompt,
                    n_gen,
                    n_depth,
                    backend: backend.clone(),
                };
                eprintln!("{:<14} {:>10.1} tokens/s", cell.test, cell.tokens_per_s);
                println!("{}", serde_json::to_string(&cell)?);
            }
            // A cell the model cannot run (past its window) is reported and
            // the others still run.
            Err(e) => {
                failed += 1;
                eprintln!("{test:<14} failed: {e:#}");
                let line = serde_json::json!({"test": test, "error": format!("{e:#}")});
                println!("{line}");
            }
        }
    }
    if failed > 0 {
        bail!("{failed} cell(s) failed");
    }
    Ok(())
}

/// llama-bench's name of a cell: `pp512`, `tg128@d8192`.
fn cell_name(kind: &str, n: usize, depth: usize) -> String {
    match depth {
        0 => format!("{kind}{n}"),
        d => format!("{kind}{n}@d{d}"),
    }
}

/// Tokens/s of each repetition of one cell.
fn time_cell(
    engine: &Engine,
    vocab: usize,
    repetitions: usize,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
) -> Result<Vec<f64>> {
    let mut samples = Vec::new();
    for rep in 0..repetitions {
        // A fresh prompt each repetition: nothing is reused but a prefill
        // cell's own retained context.
        let seed = rep as u64 + 1;
        let rate = if n_gen == 0 && n_depth > 0 {
            // The context is prefilled and retained untimed; the timed
            // request extends it, so only the new tokens are prefilled.
            let mut tokens = random_tokens(vocab, n_depth, seed);
            retain(engine, tokens.clone())?;
            // New tokens seeded by their count too: a longer cell over the
            // same context must not find a shorter one's tokens retained.
            tokens.extend(random_tokens(
                vocab,
                n_prompt,
                seed + 1000 * n_prompt as u64,
            ));
            let out = generate_with(engine, tokens, 1, true)?;
            if out.cached_tokens != n_depth {
                bail!(
                    "{} of the {n_depth} context tokens were reused",
                    out.cached_tokens
                );
            }
            n_prompt as f64 / seconds(out.prefill_time)
        } else if n_gen == 0 {
            let out = generate(engine, random_tokens(vocab, n_prompt, seed), 1)?;
            n_prompt as f64 / seconds(out.prefill_time)
        } else {
            let context = random_tokens(vocab, n_depth.max(1), seed);
            let out = generate(engine, context, n_gen)?;
            if out.completion_tokens != n_gen {
                bail!("{} of {n_gen} tokens decoded", out.completion_tokens);
            }
            // The first token comes with the prefill; the rest are decode steps.
            (n_gen - 1) as f64 / seconds(out.decode_time)
        };
        samples.push(rate);
    }
    Ok(samples)
}

/// A shared-batch cell's result.
#[derive(Serialize)]
struct StreamsCell {
    /// `pp200+tg128x16`: each of 16 streams prefills 200 and decodes 128.
    test: String,
    streams: usize,
    n_prompt: usize,
    n_gen: usize,
    /// Reply tokens of every stream over the wall time, prefill included.
    tokens_per_s: f64,
    /// Seconds until every stream had its first token.
    first_tokens_s: f64,
    rounds: usize,
    round_ms_median: f64,
    round_ms_max: f64,
}

/// `streams` greedy requests admitted together into one batch and stepped
/// until all are done: the engine's side of serving, without HTTP.
fn time_streams(
    engine: &Engine,
    vocab: usize,
    streams: usize,
    n_prompt: usize,
    n_gen: usize,
) -> Result<StreamsCell> {
    let started = Instant::now();
    let mut batch = engine.batch();
    for i in 0..streams {
        let mut request = GenerateRequest::new(Prompt::Tokens(random_tokens(
            vocab,
            n_prompt,
            1000 + i as u64,
        )));
        request.max_tokens = n_gen;
        request.ignore_eos = true;
        request.draft = false;
        request.cache_prompt = false;
        batch.admit(engine.prepare(request)?, |_: &str| true)?;
    }
    let mut rounds = Vec::new();
    let mut produced = 0;
    let mut first_tokens = None;
    while !batch.is_empty() {
        let round = Instant::now();
        for (_, done) in batch.step() {
            produced += done?.completion_tokens;
        }
        rounds.push(round.elapsed().as_secs_f64() * 1e3);
        if first_tokens.is_none() && batch.prefilling() == 0 {
            first_tokens = Some(started.elapsed());
        }
    }
    let wall = started.elapsed();
    if produced != streams * n_gen {
        bail!("{produced} of {} tokens decoded", streams * n_gen);
    }
    Ok(StreamsCell {
        test: format!("pp{n_prompt}+tg{n_gen}x{streams}"),
        streams,
        n_prompt,
        n_gen,
        tokens_per_s: produced as f64 / seconds(wall),
        first_tokens_s: first_tokens.unwrap_or(wall).as_secs_f64(),
        rounds: rounds.len(),
        round_ms_median: median(&rounds),
        round_ms_max: rounds.iter().copied().fold(0.0, f64::max),
    })
}

/// A greedy, serial, uncached request: every repetition starts cold.
fn generate(engine: &Engine, tokens: Vec<u32>, max_tokens: usize) -> Result<Completion> {
    generate_with(engine, tokens, max_tokens, false)
}

/// Prefills `tokens` and keeps their state for a later request to extend.
fn retain(engine: &Engine, tokens: Vec<u32>) -> Result<()> {
    generate_with(engine, tokens, 1, true).map(drop)
}

/// A greedy, serial request whose state is kept when `cache_prompt`.
fn generate_with(
    engine: &Engine,
    tokens: Vec<u32>,
    max_tokens: usize,
    cache_prompt: bool,
) -> Result<Completion> {
    let mut request = GenerateRequest::new(Prompt::Tokens(tokens));
    request.max_tokens = max_tokens;
    request.ignore_eos = true;
    request.draft = false;
    request.cache_prompt = cache_prompt;
    Ok(engine.generate(&request, &mut |_| true)?)
}

/// Token ids drawn uniformly from the vocabulary, as llama-bench draws them.
fn random_tokens(vocab: usize, count: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            // xorshift64: cheap, deterministic, good enough for token ids.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64().max(1e-9)
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
