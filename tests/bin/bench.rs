//! `cargo xtask bench`: paired benchmarks. Every ratio compares cells
//! measured side by side in this one run, alternating, and reports medians.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tensorfold_engine::{DrafterChoice, Engine, GenerateRequest, Prompt, SamplingParams};
use tensorfold_kv::KvCache;
use tensorfold_models::Logits;
use tensorfold_tests::models_dir;

const CODE_PROMPT: &str = "Here is a Python module:\n\n```python\nimport math\n\n\ndef circle_area(radius):\n    return math.pi * radius ** 2\n\n\ndef circle_perimeter(radius):\n    return 2 * math.pi * radius\n\n\ndef square_area(side):\n    return side * side\n```\n\nRepeat the module exactly, adding a docstring to each function.";
const CHAT_PROMPT: &str = "Give me three tips for staying focused while studying.";

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
    let engine = Engine::load(path).expect("model");
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
    let engine = Engine::load(path).expect("model");
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
    let mut engine = Engine::load(target).expect("model");
    let mut drafters = vec![
        ("context", DrafterChoice::Context),
        ("auto", DrafterChoice::Auto),
    ];
    if let Some(d) = draft {
        engine.set_draft_model(d).expect("draft pair");
        drafters.insert(1, ("model", DrafterChoice::Model));
    }
    for (pname, prompt) in [("code", CODE_PROMPT), ("chat", CHAT_PROMPT)] {
        for sampled in [false, true] {
            for (dname, choice) in &drafters {
                let (mut serial, mut drafted) = (Vec::new(), Vec::new());
                let mut tpr = Vec::new();
                for _ in 0..reps {
                    let (t, _) = timed(&engine, &request(prompt, sampled, false));
                    serial.push(t.as_secs_f64());
                    engine.set_drafter(*choice).unwrap();
                    let (t, out) = timed(&engine, &request(prompt, sampled, true));
                    drafted.push(t.as_secs_f64());
                    tpr.push(out.draft.tokens_per_round());
                }
                let (s, d) = (median(serial), median(drafted));
                println!(
                    "paired  {:<18} {:<5} {:<8} {:<8} serial {:>6.2}s  drafted {:>6.2}s  speedup {:>5.2}x  {:>5.2} tok/round",
                    name,
                    pname,
                    if sampled { "sampled" } else { "greedy" },
                    dname,
                    s,
                    d,
                    s / d,
                    median(tpr)
                );
            }
        }
    }
}

fn main() {
    let qwen = std::env::args().any(|a| a == "--qwen");
    // `--rounds`: only the decode and round-cost cells (a quick kernel check).
    let rounds_only = std::env::args().any(|a| a == "--rounds");
    let reps: usize = std::env::var("BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
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
    let (q05, q15) = (
        m.join("qwen2.5-coder-0.5b-instruct.gguf"),
        m.join("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    );
    if qwen && q05.exists() && q15.exists() {
        decode_cell(&q15, bandwidth);
        paired_cells("qwen2.5-coder-1.5b", &q15, Some(&q05), reps);
    }
}
