//! Any bytes as the `config.json` of a model directory with valid weights:
//! sizes, counts and hyper-parameters are checked before anything is
//! allocated for them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let source = tensorfold_fuzz::tiny_hf_dir();
    let dir = tensorfold_fuzz::scratch().join("config");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    for file in ["model.safetensors", "tokenizer.json"] {
        if !dir.join(file).exists() {
            std::fs::copy(source.join(file), dir.join(file)).expect("copy fixture");
        }
    }
    std::fs::write(dir.join("config.json"), data).expect("scratch write");
    if tensorfold_models::inspect(&dir).is_ok() {
        let _ = tensorfold_models::load(&dir);
    }
});
