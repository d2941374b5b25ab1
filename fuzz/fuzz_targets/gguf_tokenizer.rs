//! Tokenizer metadata from a GGUF file: any token list, token types,
//! merges, pre-tokenizer name and special ids make a tokenizer or an
//! error, and the tokenizer encodes and decodes without panicking.
//!
//! Input: lines; the first names the pre-tokenizer, the second holds the
//! token types (one byte each, as digits), then `tokens` up to an empty
//! line and merges after it; the rest of the bytes are text to encode.
#![no_main]

use candle_core::quantized::gguf_file::{write, Value};
use libfuzzer_sys::fuzz_target;
use tensorfold_models::GgufFile;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let pre = lines.next().unwrap_or_default().to_string();
    let types: Vec<Value> = lines
        .next()
        .unwrap_or_default()
        .bytes()
        .map(|b| Value::I32(i32::from(b) - i32::from(b'0')))
        .collect();
    let tokens: Vec<Value> = lines
        .by_ref()
        .take_while(|l| !l.is_empty())
        .map(|l| Value::String(l.to_string()))
        .collect();
    let merges: Vec<Value> = lines.map(|l| Value::String(l.to_string())).collect();
    let sample = text.chars().rev().take(64).collect::<String>();
    let ids = (tokens.len() as u32).wrapping_mul(7) ^ 3;
    let entries = [
        ("general.architecture", Value::String("llama".into())),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre)),
        ("tokenizer.ggml.tokens", Value::Array(tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.merges", Value::Array(merges)),
        ("tokenizer.ggml.bos_token_id", Value::U32(ids)),
        ("tokenizer.ggml.eos_token_id", Value::U32(ids / 2)),
    ];
    let metadata: Vec<(&str, &Value)> = entries.iter().map(|(k, v)| (*k, v)).collect();
    let path = tensorfold_fuzz::scratch().join("tokenizer.gguf");
    let mut file = std::fs::File::create(&path).expect("scratch file");
    write(&mut file, &metadata, &[]).expect("GGUF writer");
    drop(file);
    let Ok(gguf) = GgufFile::open(&path) else {
        return;
    };
    let Ok(tokenizer) = gguf.tokenizer() else {
        return;
    };
    if let Ok(encoding) = tokenizer.encode(sample.as_str(), false) {
        let _ = tokenizer.decode(encoding.get_ids(), false);
    }
    let _ = tokenizer.decode(&[0, 1, ids, u32::MAX], true);
});
