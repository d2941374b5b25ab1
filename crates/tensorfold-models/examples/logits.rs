//! The logits of every position of token-id prompts, for comparing the CPU
//! forward with another engine on the same weights.
//!
//! usage: logits MODEL < prompts.json   (a JSON array of token-id arrays)
//! prints a JSON array: for each prompt, one array of logits per position.

use std::io::Read;
use tensorfold_kv::KvCache;
use tensorfold_models::Logits;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, path] = args.as_slice() else {
        return Err("usage: logits MODEL < prompts.json".into());
    };
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let prompts: Vec<Vec<u32>> = serde_json::from_str(&input)?;
    let model = tensorfold_models::load(path.as_ref())?.model;
    let vocab = model.config.vocab_size;
    let mut out = Vec::new();
    for prompt in &prompts {
        let mut cache = KvCache::new(model.config.kv_shape());
        let rows = model.forward(prompt, &mut cache, Logits::All);
        out.push(
            rows.chunks_exact(vocab)
                .map(<[f32]>::to_vec)
                .collect::<Vec<_>>(),
        );
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
