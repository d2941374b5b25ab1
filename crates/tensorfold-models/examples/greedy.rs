//! Greedy continuations of token-id prompts, for comparing the CPU forward
//! with another engine on the same file.
//!
//! usage: greedy MODEL N < prompts.json   (a JSON array of token-id arrays)
//! prints a JSON array: each prompt's N greedy token ids (argmax, ties to
//! the lower id), end-of-sequence tokens included.

use std::io::Read;
use tensorfold_kv::KvCache;
use tensorfold_models::Logits;

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, n] = args.as_slice() else {
        return Err("usage: greedy MODEL N < prompts.json".into());
    };
    let n: usize = n.parse()?;
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let prompts: Vec<Vec<u32>> = serde_json::from_str(&input)?;
    let model = tensorfold_models::load(path.as_ref())?.model;
    let mut out = Vec::new();
    for prompt in &prompts {
        let mut cache = KvCache::new(model.config.kv_shape());
        let mut next = argmax(&model.forward(prompt, &mut cache, Logits::Last));
        let mut reply = vec![next];
        while reply.len() < n {
            next = argmax(&model.forward(&[next], &mut cache, Logits::Last));
            reply.push(next);
        }
        out.push(reply);
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
