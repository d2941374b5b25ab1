//! Top-1 agreement of affine-quantized SmolLM2 with its source, per bit
//! width: `cargo run --release -p tensorfold-tests --bin agreement`
//! (`-- --products` measures only the integer products, below).
//!
//! First, for each registry GGUF, the integer products (inputs quantized to
//! 8 bits per block of 32) against the same weights multiplied as decoded
//! f32 values: top-1 agreement and mean KL divergence over the text.
//!
//! The source is quantized in memory at each setting, written in the MLX
//! layout, loaded back, and both models run a fixed text; a position agrees
//! when the two argmax tokens are equal. The greedy chat reply to "What is
//! the capital of France?" is shown beside it.

use tensorfold_engine::{DrafterChoice, Engine, GenerateRequest, Prompt};
use tensorfold_kv::KvCache;
use tensorfold_models::mlx::{self, MlxQuantization, QuantizeOptions};
use tensorfold_models::{Affine, Logits, QuantRule, ScaleDtype};

const TEXT: &str = "The history of the bicycle begins in the early nineteenth century. \
    In 1817 Karl Drais built a two-wheeled running machine that riders pushed along with \
    their feet. Pedals attached to the front wheel arrived in the 1860s in France, and the \
    high-wheeled penny-farthing followed in the 1870s. The safety bicycle, with two wheels \
    of equal size and a chain driving the rear wheel, appeared in the 1880s and made cycling \
    popular across Europe and America. Pneumatic tyres, invented by John Dunlop in 1888, \
    made the ride far more comfortable. Today bicycles are used for commuting, sport and \
    recreation all over the world, and cities build lanes to keep cyclists safe.";

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best
}

fn softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
    let exps: Vec<f64> = row.iter().map(|v| (*v as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Integer against float products on each registry GGUF that is present.
fn integer_against_float() {
    println!(
        "{:<44} {:>8} {:>12}  replies (float | integer)",
        "model", "top-1", "mean KL"
    );
    for name in [
        "smollm2-135m-instruct-q4_1.gguf",
        "qwen2.5-coder-0.5b-instruct.gguf",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ] {
        let path = tensorfold_tests::models_dir().join(name);
        if !path.exists() {
            println!("{name:<44} missing: run `cargo xtask models --all`");
            continue;
        }
        let bundle = tensorfold_models::load(&path).expect("model loads");
        let ids = bundle.tokenizer.encode(TEXT, false).expect("encodes");
        let vocab = bundle.model.config.vocab_size;
        let run = |float: bool| {
            tensorfold_models::set_float_products(float);
            let mut cache = KvCache::new(bundle.model.config.kv_shape());
            let logits = bundle.model.forward(ids.get_ids(), &mut cache, Logits::All);
            let mut e = Engine::load(&path).expect("engine loads");
            e.set_drafter(DrafterChoice::None).unwrap();
            let mut req = GenerateRequest::new(Prompt::chat_user("Name the capital of France."));
            req.max_tokens = 12;
            let reply = e.generate(&req, &mut |_| true).expect("generates").text;
            (logits, reply)
        };
        let ((float, float_reply), (integer, integer_reply)) = (run(true), run(false));
        let rows = float.len() / vocab;
        let (mut same, mut kl) = (0, 0.0);
        for (f, i) in float.chunks_exact(vocab).zip(integer.chunks_exact(vocab)) {
            same += (argmax(f) == argmax(i)) as usize;
            let (p, q) = (softmax(f), softmax(i));
            kl += p
                .iter()
                .zip(&q)
                .map(|(p, q)| if *p > 0.0 { p * (p / q).ln() } else { 0.0 })
                .sum::<f64>();
        }
        println!(
            "{name:<44} {:>7.1}% {:>12.2e}  {float_reply:?} | {integer_reply:?}",
            100.0 * same as f64 / rows as f64,
            kl / rows as f64
        );
    }
}

fn main() {
    integer_against_float();
    if std::env::args().any(|a| a == "--products") {
        return;
    }
    println!();
    let src = tensorfold_tests::models_dir().join("smollm2-135m-instruct-q4_1.gguf");
    if !src.exists() {
        eprintln!("{} is missing: run `cargo xtask models`", src.display());
        std::process::exit(1);
    }
    let source = tensorfold_models::load(&src).expect("source loads");
    let ids = source.tokenizer.encode(TEXT, false).expect("encodes");
    let ids = ids.get_ids();
    let vocab = source.model.config.vocab_size;
    let top1 = |m: &tensorfold_models::Model| -> Vec<usize> {
        let mut cache = KvCache::new(m.config.kv_shape());
        let logits = m.forward(ids, &mut cache, Logits::All);
        logits.chunks_exact(vocab).map(argmax).collect()
    };
    let want = top1(&source.model);
    let reply = |path: &std::path::Path| -> String {
        let mut e = Engine::load(path).expect("engine loads");
        e.set_drafter(DrafterChoice::None).unwrap();
        let mut req = GenerateRequest::new(Prompt::chat_user("Name the capital of France."));
        req.max_tokens = 12;
        e.generate(&req, &mut |_| true).expect("generates").text
    };
    println!("source: {} ({} positions)", src.display(), want.len());
    println!(
        "{:<24} {:>12} {:>10}  reply",
        "setting", "weight MB", "top-1"
    );
    println!(
        "{:<24} {:>12.1} {:>9.1}%  {:?}",
        "source Q4_1",
        source.model.weight_bytes() as f64 / 1e6,
        100.0,
        reply(&src)
    );
    let dir = std::env::temp_dir().join(format!("tensorfold-agreement-{}", std::process::id()));
    let settings: &[(u32, usize, Option<u32>)] = &[
        (8, 64, None),
        (6, 64, None),
        (6, 64, Some(8)),
        (6, 32, None),
        (6, 32, Some(8)),
        (5, 64, Some(8)),
        (4, 64, None),
        (4, 64, Some(8)),
        (4, 32, Some(8)),
        (3, 64, Some(8)),
        (3, 32, Some(8)),
        (2, 32, Some(8)),
    ];

    let rules = [(QuantRule::Search, "search"), (QuantRule::Mlx, "mlx")];
    for (&(bits, group, embed), &(rule, rule_name)) in settings
        .iter()
        .flat_map(|s| rules.iter().map(move |r| (s, r)))
    {
        let mut q = MlxQuantization::uniform(Affine::new(bits, group).unwrap());
        let mut name = format!("{bits}-bit g{group} {rule_name}");
        if let Some(e) = embed {
            q.overrides.insert(
                "model.embed_tokens".into(),
                Some(Affine::new(e, 64).unwrap()),
            );
            name += &format!(" embed {e}-bit");
        }
        let opts = QuantizeOptions {
            quantization: q,
            scales: ScaleDtype::F16,
            rule,
        };
        let _ = std::fs::remove_dir_all(&dir);
        mlx::write(&source, &opts, &dir).expect("writes");
        let b = tensorfold_models::load(&dir).expect("loads back");
        let got = top1(&b.model);
        let same = got.iter().zip(&want).filter(|(a, b)| a == b).count();
        println!(
            "{:<24} {:>12.1} {:>9.1}%  {:?}",
            name,
            b.model.weight_bytes() as f64 / 1e6,
            100.0 * same as f64 / want.len() as f64,
            reply(&dir)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
