//! Any bytes as a GGUF file: `inspect` (header, metadata, configuration,
//! tensor table) and, when it accepts them, `load`, must answer an error
//! or a model, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = tensorfold_fuzz::scratch().join("input.gguf");
    std::fs::write(&path, data).expect("scratch write");
    if tensorfold_models::inspect(&path).is_ok() {
        let _ = tensorfold_models::load(&path);
    }
});
