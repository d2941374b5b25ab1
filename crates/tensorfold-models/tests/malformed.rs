//! Malformed model files answer clear errors, never a panic: the fuzzing
//! seeds (`fuzz/seeds`), including the inputs that once crashed a loader.

use std::path::{Path, PathBuf};
use tensorfold_models::{inspect, load, GgufFile, ModelError};

fn seed(target: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target)
        .join(name)
}

fn load_error(path: &Path) -> String {
    match load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

/// The tokenizer built from a GGUF file's metadata alone (these seeds hold
/// no weights, which `load` refuses before it reads the vocabulary).
fn tokenizer_error(path: &Path) -> String {
    let gguf = GgufFile::open(path).expect("the header reads");
    match gguf.tokenizer() {
        Ok(_) => panic!("{} built a tokenizer", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn alignment_zero_is_an_error_not_a_division_by_zero() {
    let err = load_error(&seed("gguf_header", "alignment_zero.gguf"));
    assert!(
        err.contains("general.alignment must be a power of two"),
        "{err}"
    );
}

#[test]
fn token_types_past_the_token_list_are_an_error() {
    let err = tokenizer_error(&seed("gguf_header", "types_past_tokens.gguf"));
    assert!(err.contains("6 token types for 4 tokens"), "{err}");
}

#[test]
fn a_tensor_offset_past_the_file_is_an_error() {
    let err = inspect(&seed("gguf_header", "offset_past_end.gguf")).unwrap_err();
    assert!(matches!(err, ModelError::Malformed(_)), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn every_gguf_seed_answers_without_panicking() {
    for entry in std::fs::read_dir(seed("gguf_header", "")).unwrap() {
        let path = entry.unwrap().path();
        let _ = inspect(&path).and_then(|_| load(&path).map(|_| ()));
    }
}

/// A model directory of the tiny random model, with `config.json` or
/// `model.safetensors` replaced when given.
fn hf_dir(name: &str, config: &str, weights: &[u8]) -> PathBuf {
    use tensorfold_models::synth::{write_hf, SynthSpec};
    use tensorfold_models::{Arch, Format};
    let dir = std::env::temp_dir().join(format!(
        "tensorfold-malformed-{name}-{}",
        std::process::id()
    ));
    write_hf(&dir, &SynthSpec::tiny(Arch::Llama, Format::F32, 2)).unwrap();
    if !config.is_empty() {
        std::fs::write(dir.join("config.json"), config).unwrap();
    }
    if !weights.is_empty() {
        std::fs::write(dir.join("model.safetensors"), weights).unwrap();
    }
    dir
}

#[test]
fn safetensors_headers_are_checked_before_use() {
    for name in [
        "small.safetensors",
        "offset_past_end.safetensors",
        "affine.safetensors",
    ] {
        let bytes = std::fs::read(seed("safetensors_header", name)).unwrap();
        let dir = hf_dir(name, "", &bytes);
        assert!(load(&dir).is_err(), "{name} loaded");
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn config_values_are_bounded() {
    let dir = hf_dir("config", "", &[]);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let cases = [
        ("num_hidden_layers", serde_json::json!(1u64 << 40), "layers"),
        (
            "vocab_size",
            serde_json::json!(0),
            "vocab_size must be positive",
        ),
        ("rms_norm_eps", serde_json::json!(-1.0), "rms_eps"),
        ("num_key_value_heads", serde_json::json!(3), "do not group"),
    ];
    for (key, value, expected) in cases {
        let mut bad = config.clone();
        bad[key] = value;
        std::fs::write(dir.join("config.json"), bad.to_string()).unwrap();
        let err = inspect(&dir).unwrap_err().to_string();
        assert!(err.contains(expected), "{key}: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Found by fuzzing: a tensor whose stated size in bytes overflows.
#[test]
fn a_tensor_size_that_overflows_is_an_error() {
    let err = inspect(&seed("gguf_header", "crash_size_overflow.gguf")).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}

/// Found by fuzzing: a merge whose joined token is not in the vocabulary
/// (the BPE builder indexed past its buffer).
#[test]
fn a_merge_outside_the_vocabulary_is_an_error() {
    let err = tokenizer_error(&seed("gguf_header", "merge_outside_vocab.gguf"));
    assert!(err.contains("not in the vocabulary"), "{err}");
}
