//! `cargo xtask bench`: paired benchmarks. Every ratio compares cells
//! measured side by side in this one run, alternating, and reports medians.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tensorfold_engine::{
    BackendChoice, DrafterChoice, Engine, GenerateRequest, Prompt, SamplingParams,
};
use tensorfold_kv::KvCache;
use tensorfold_models::Logits;
use tensorfold_tests::models_dir;

const CODE_PROMPT: &str = "Here is a Python module:\n\n```python\nimport math\n\n\ndef circle_area(radius):\n    return math.pi * radius ** 2\n\n\ndef circle_perimeter(radius):\n    return 2 * math.pi * radius\n\n\ndef square_area(side):\n    return side * side\n```\n\nRepeat the module exactly, adding a docstring to each function.";
const COPY_PROMPT: &str = "Here is a Python module:\n\n```python\nimport math\n\n\ndef circle_area(radius):\n    return math.pi * radius ** 2\n\n\ndef circle_perimeter(radius):\n    return 2 * math.pi * radius\n\n\ndef square_area(side):\n    return side * side\n\n\ndef square_perimeter(side):\n    return 4 * side\n```\n\nRepeat the module exactly, with `radius` renamed to `r`.";
const CHAT_PROMPT: &str = "Give me three tips for staying focused while studying.";

/// The engine for `path`, its target on the device `--backend` names
/// (`cpu` unless given).
fn load(path: &Path) -> Engine {
    let args: Vec<String> = std::env::args().collect();
    let backend = args
        .iter()
        .position(|a| a == "--backend")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(BackendChoice::Cpu), |b| b.parse())
        .expect("--backend cpu|cuda");
    let mut engine = Engine::load(path).expect("model");
    engine.set_backend(backend).expect("backend");
    engine
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Copy bandwidth in bytes per second (bytes read plus bytes written).
fn copy_bandwidth() -> f64 {
    let n = 256 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * n as f64 / best
}

fn request(prompt: &str, sampled: bool, draft: bool) -> GenerateRequest {
    let mut req = GenerateRequest::new(Prompt::chat_user(prompt));
    req.max_tokens = 64;
    req.ignore_eos = true;
    req.draft = draft;
    // Cold prompts: no state retained by an earlier cell.
    req.cache_prompt = false;
    if sampled {
        req.sampling = SamplingParams {
            temperature: 0.7,
            top_k: Some(40),
            top_p: 0.95,
            min_p: 0.0,
            seed: Some(3),
        };
    }
    req
}

fn timed(engine: &Engine, req: &GenerateRequest) -> (Duration, tensorfold_engine::Completion) {
    let t = Instant::now();
    let out = engine.generate(req, &mut |_| true).expect("bench request");
    (t.elapsed(), out)
}

fn decode_cell(path: &Path, bandwidth: f64) {
    let engine = load(path);
    let req = request(CHAT_PROMPT, false, false);
    let mut rates = Vec::new();
    for _ in 0..3 {
        let (_, out) = timed(&engine, &req);
        rates.push(out.completion_tokens as f64 / out.decode_time.as_secs_f64());
    }
    let bytes = engine.bundle().model.bytes_per_token() as f64;
    let bound = bandwidth / bytes;
    let rate = median(rates);
    println!(
        "decode  {:<34} {:>7.1} tok/s   bound {:>7.1} tok/s ({:.0} MB/token at {:.1} GB/s)   {:.2} of bound",
        path.file_name().unwrap().to_string_lossy(),
        rate,
        bound,
        bytes / 1e6,
        bandwidth / 1e9,
        rate / bound
    );
}

/// Wall time of one verification forward by its number of rows (pending
/// token plus drafts), at a fixed context length: what a round costs.
fn round_cells(path: &Path, reps: usize) {
    let engine = load(path);
    let model = &engine.bundle().model;
    let vocab = model.config.vocab_size as u32;
    let tokens: Vec<u32> = (0..160u32).map(|i| (i * 7919 + 11) % vocab).collect();
    let mut cache = KvCache::new(model.config.kv_shape());
    model.forward(&tokens[..128], &mut cache, Logits::None);
    let base = cache.len();
    let mut one = 0.0;
    for rows in [1, 2, 3, 5, 9] {
        let mut times = Vec::new();
        for _ in 0..reps.max(1) * 8 {
            let t = Instant::now();
            std::hint::black_box(model.forward(
                &tokens[base..base + rows],
                &mut cache,
                Logits::All,
            ));
            times.push(t.elapsed().as_secs_f64() * 1e3);
            cache.truncate(base);
        }
        let ms = median(times);
        if rows == 1 {
            one = ms;
        }
        println!(
            "round   {:<34} {} rows {:>7.2} ms   {:>5.2}x one row",
            path.file_name().unwrap().to_string_lossy(),
            rows,
            ms,
            ms / one
        );
    }
}

fn paired_cells(name: &str, target: &Path, draft: Option<&Path>, reps: usize) {
    let mut engine = load(target);
    let mut drafters = vec![
        ("context", DrafterChoice::Context),
        ("auto", DrafterChoice::Auto),
    ];
    if let Some(d) = draft {
        engine.set_draft_model(d).expect("draft pair");
        drafters.insert(1, ("model", DrafterChoice::Model));
    }
    for (pname, prompt) in [
        ("code", CODE_PROMPT),
        ("copy", COPY_PROMPT),
        ("chat", CHAT_PROMPT),
    ] {
        for sampled in [false, true] {
            for (dname, choice) in &drafters {
                let (mut serial, mut drafted) = (Vec::new(), Vec::new());
                // First token to last: the part drafting speeds up (the
                // prompt's prefill is the same work either way).
                let (mut serial_decode, mut drafted_decode) = (Vec::new(), Vec::new());
                let mut tpr = Vec::new();
                engine.set_drafter(*choice).unwrap();
                for rep in 0..reps {
                    // Alternate which of the pair runs first, so drift and
                    // warm-up fall on both sides alike.
                    for draft in [rep % 2 == 1, rep % 2 == 0] {
                        let (t, out) = timed(&engine, &request(prompt, sampled, draft));
                        let decode = out.decode_time.as_secs_f64();
                        if draft {
                            drafted.push(t.as_secs_f64());
                            drafted_decode.push(decode);
                            tpr.push(out.draft.tokens_per_round());
                        } else {
                            serial.push(t.as_secs_f64());
                            serial_decode.push(decode);
                        }
                    }
                }
                // Each pair ran back to back: the median of the pairs'
                // ratios is the least disturbed by load that comes and goes.
                let ratios =
                    |a: &[f64], b: &[f64]| median(a.iter().zip(b).map(|(s, d)| s / d).collect());
                let pair_ratio = ratios(&serial, &drafted);
                let decode_ratio = ratios(&serial_decode, &drafted_decode);
                // Beside it: the ratio of the medians, and of the fastest runs.
                let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
                let (bs, bd) = (best(&serial), best(&drafted));
                let (s, d) = (median(serial), median(drafted));
                println!(
                    "paired  {:<18} {:<5} {:<8} {:<8} serial {:>6.2}s  drafted {:>6.2}s  speedup {:>5.2}x (medians {:>5.2}x, best {:>5.2}x)  decode {:>5.2}x  {:>5.2} tok/round",
                    name,
                    pname,
                    if sampled { "sampled" } else { "greedy" },
                    dname,
                    s,
                    d,
                    pair_ratio,
                    s / d,
                    bs / bd,
                    decode_ratio,
                    median(tpr)
                );
            }
        }
    }
}

/// Peak resident bytes since the last reset, and a reset (Linux).
fn peak_rss() -> usize {
    tensorfold_engine::memory::resident().1
}

fn reset_peak_rss() {
    // Writing 5 to clear_refs resets VmHWM to the current RSS.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// `n` streams admitted together, 64-token replies: aggregate and
/// per-stream tokens/s, peak RSS against the budget. Cells alternate by
/// stream count within each repetition.
fn concurrency_cells(path: &Path, reps: usize) {
    let engine = load(path);
    let counts = [1usize, 2, 4, 8, 16];
    let mut aggregate = vec![Vec::new(); counts.len()];
    let mut per_stream = vec![Vec::new(); counts.len()];
    let mut peak = vec![0usize; counts.len()];
    for _ in 0..reps {
        for (c, &n) in counts.iter().enumerate() {
            let requests: Vec<GenerateRequest> = (0..n)
                .map(|i| {
                    let prompt = if i % 2 == 0 { CHAT_PROMPT } else { CODE_PROMPT };
                    request(&format!("{prompt} ({i})"), i % 4 == 3, true)
                })
                .collect();
            reset_peak_rss();
            let started = Instant::now();
            let mut batch = engine.batch();
            for r in requests {
                let prepared = engine.prepare(r).expect("bench request");
                batch.admit(prepared, |_: &str| true).expect("fits");
            }
            let mut tokens = 0;
            let mut rates = Vec::new();
            while !batch.is_empty() {
                for (_, done) in batch.step() {
                    let done = done.expect("bench stream");
                    tokens += done.completion_tokens;
                    rates.push(done.completion_tokens as f64 / done.decode_time.as_secs_f64());
                }
            }
            aggregate[c].push(tokens as f64 / started.elapsed().as_secs_f64());
            per_stream[c].push(median(rates));
            peak[c] = peak[c].max(peak_rss());
        }
    }
    let budget = engine.memory();
    println!(
        "\nconcurrency ({}; 64-token replies, chat and code prompts, greedy and sampled, drafting auto; budget {})",
        path.file_name().unwrap().to_string_lossy(),
        tensorfold_engine::memory::Bytes(budget.limit)
    );
    println!(
        "{:>8} {:>12} {:>10} {:>14} {:>12} {:>10}",
        "streams", "agg tok/s", "x 1 stream", "per-stream t/s", "peak RSS", "of budget"
    );
    let one = median(aggregate[0].clone());
    for (c, &n) in counts.iter().enumerate() {
        let agg = median(aggregate[c].clone());
        println!(
            "{:>8} {:>12.1} {:>9.2}x {:>14.1} {:>12} {:>9.1}%",
            n,
            agg,
            agg / one,
            median(per_stream[c].clone()),
            tensorfold_engine::memory::Bytes(peak[c]).to_string(),
            100.0 * peak[c] as f64 / budget.limit as f64
        );
    }
}

const AGENT_SYSTEM: &str = "You are a coding agent working in a repository. You can call tools: \
read_file(path) returns a file's text; list_dir(path) lists a folder; run(cmd) runs a shell command and returns its output; \
write_file(path, text) replaces a file. Call one tool per turn as JSON like {\"tool\": \"read_file\", \"path\": \"src/main.rs\"}. \
Think step by step, keep changes small, run the tests after each change, and report what you changed when done.";

/// The user or tool message that starts turn `t` of the agent session.
fn agent_message(t: usize) -> serde_json::Value {
    if t == 0 {
        return serde_json::json!({"role": "user", "content": "The test `parses_empty_input` fails in src/parse.rs. Find out why and fix it."});
    }
    let output = format!(
        "Tool result (turn {t}):\n```\nfn parse(input: &str) -> Result<Vec<Token>, Error> {{\n    let mut tokens = Vec::new();\n    for (i, line) in input.lines().enumerate() {{\n        tokens.push(Token::line(i, line)?);\n    }}\n    Ok(tokens)\n}}\ntest parses_empty_input ... {}\n```",
        if t.is_multiple_of(2) { "FAILED" } else { "ok" }
    );
    serde_json::json!({"role": "user", "content": output})
}

/// A 12-turn agent session: each turn sends the whole conversation. Time to
/// first token summed over the turns, with retained prompt states against
/// without (the same replies either way), and the cost of retention on a
/// cold prompt.
fn agent_cells(path: &Path, reps: usize) {
    let engine = load(path);
    let turn_request = |history: &[serde_json::Value], cache: bool| {
        let mut r = GenerateRequest::new(Prompt::Chat {
            messages: history.to_vec(),
            template_vars: Default::default(),
        });
        r.max_tokens = 32;
        r.cache_prompt = cache;
        r
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut prompt_tokens = 0;
    // Tokens of the previous turn (prompt and reply) the next one reused.
    let (mut reused, mut offered) = (0, 0);
    for rep in 0..reps {
        let system = format!("Session {rep}. {AGENT_SYSTEM}");
        let mut history = vec![serde_json::json!({"role": "system", "content": system})];
        let (mut ttft_with, mut ttft_without) = (0.0, 0.0);
        let mut previous = 0;
        for t in 0..12 {
            history.push(agent_message(t));
            let off = timed(&engine, &turn_request(&history, false)).1;
            let on = timed(&engine, &turn_request(&history, true)).1;
            assert_eq!(on.tokens, off.tokens, "resumed replies equal fresh ones");
            ttft_with += on.prefill_time.as_secs_f64();
            ttft_without += off.prefill_time.as_secs_f64();
            prompt_tokens = on.prompt_tokens;
            if t > 0 {
                reused += on.cached_tokens;
                offered += previous;
            }
            previous = on.prompt_tokens + on.completion_tokens;
            history.push(serde_json::json!({"role": "assistant", "content": on.text}));
        }
        with.push(ttft_with);
        without.push(ttft_without);
    }
    // Cold prompts (nothing to reuse): retention on against off.
    let (mut cold_on, mut cold_off) = (Vec::new(), Vec::new());
    for rep in 0..3 * reps {
        let history = [
            serde_json::json!({"role": "system", "content": format!("Cold {rep}. {AGENT_SYSTEM}")}),
            agent_message(0),
        ];
        let on = timed(&engine, &turn_request(&history, true)).1;
        let mut fresh = history.clone();
        fresh[0] = serde_json::json!({"role": "system", "content": format!("Cold {rep}b. {AGENT_SYSTEM}")});
        let off = timed(&engine, &turn_request(&fresh, false)).1;
        cold_on.push(on.prefill_time.as_secs_f64());
        cold_off.push(off.prefill_time.as_secs_f64());
    }
    let (w, wo) = (median(with), median(without));
    println!(
        "\nagent session ({}; 12 turns, last prompt {prompt_tokens} tokens, 32-token replies)",
        path.file_name().unwrap().to_string_lossy()
    );
    println!(
        "  TTFT sum: {w:.2} s with retained prompts, {wo:.2} s without: {:.2}x; follow-ups reused {:.1}% of the previous turn's prompt and reply",
        w / wo,
        100.0 * reused as f64 / offered.max(1) as f64
    );
    let (a, b) = (median(cold_on), median(cold_off));
    println!(
        "  cold prompt TTFT: {:.1} ms retaining, {:.1} ms not: cost {:+.1}%",
        a * 1e3,
        b * 1e3,
        100.0 * (a / b - 1.0)
    );
}

fn main() {
    let qwen = std::env::args().any(|a| a == "--qwen");
    // `--paired` / `--concurrency` / `--agent`: only those cells.
    let only = |flag: &str| std::env::args().any(|a| a == flag);
    if only("--paired") || only("--concurrency") || only("--agent") {
        let reps = std::env::var("BENCH_REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        let smol = models_dir().join("smollm2-135m-instruct-q4_1.gguf");
        if only("--paired") {
            paired_cells("smollm2-135m", &smol, None, reps);
        }
        if only("--concurrency") {
            concurrency_cells(&smol, reps);
        }
        if only("--agent") {
            agent_cells(&smol, reps);
        }
        return;
    }
    // `--rounds`: only the decode and round-cost cells (a quick kernel check).
    let rounds_only = std::env::args().any(|a| a == "--rounds");
    let reps: usize = std::env::var("BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let m = models_dir();
    let smol: PathBuf = m.join("smollm2-135m-instruct-q4_1.gguf");
    let bandwidth = copy_bandwidth();
    println!(
        "copy bandwidth {:.1} GB/s, {} threads",
        bandwidth / 1e9,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    decode_cell(&smol, bandwidth);
    round_cells(&smol, reps);
    if rounds_only {
        return;
    }
    paired_cells("smollm2-135m", &smol, None, reps);
    concurrency_cells(&smol, reps);
    agent_cells(&smol, reps);
    let (q05, q15) = (
        m.join("qwen2.5-coder-0.5b-instruct.gguf"),
        m.join("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    );
    if qwen && q05.exists() && q15.exists() {
        decode_cell(&q15, bandwidth);
        paired_cells("qwen2.5-coder-1.5b", &q15, Some(&q05), reps);
    }
}
