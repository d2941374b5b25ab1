//! Any bytes as the `model.safetensors` of a model directory whose
//! `config.json` is valid: headers, dtypes, offsets and shapes are checked
//! before use.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let source = tensorfold_fuzz::tiny_hf_dir();
    let dir = tensorfold_fuzz::scratch().join("safetensors");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    for file in ["config.json", "tokenizer.json"] {
        if !dir.join(file).exists() {
            std::fs::copy(source.join(file), dir.join(file)).expect("copy fixture");
        }
    }
    std::fs::write(dir.join("model.safetensors"), data).expect("scratch write");
    if tensorfold_models::inspect(&dir).is_ok() {
        let _ = tensorfold_models::load(&dir);
    }
});
