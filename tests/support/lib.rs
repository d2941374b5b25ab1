//! Shared helpers for the end-to-end tests: model paths, fixtures, and an
//! independent f64 reference forward.

pub mod exact;
pub mod reference;

use std::path::{Path, PathBuf};
use tensorfold_models::synth::{self, SynthSpec};

/// The workspace's `models/` folder (`cargo xtask models` fills it), or
/// `TENSORFOLD_MODELS_DIR` for a harness binary run on another machine.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("TENSORFOLD_MODELS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .join("models"),
    }
}

/// A registry model, or `None` with a note when it has not been fetched.
pub fn registry_model(rel: &str) -> Option<PathBuf> {
    let p = models_dir().join(rel);
    if p.exists() {
        Some(p)
    } else if std::env::var_os("TENSORFOLD_REQUIRE_MODELS").is_some() {
        panic!("{} is missing: run `cargo xtask models`", p.display());
    } else {
        eprintln!("skipping: {} not fetched (cargo xtask models)", p.display());
        None
    }
}

/// A random-weight model written once per test process under the temp dir.
/// `name` must identify `spec`; concurrent callers see a complete model.
pub fn synth_model(name: &str, spec: &SynthSpec, gguf: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tensorfold-fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(if gguf {
        format!("{name}.gguf")
    } else {
        name.to_string()
    });
    if path.exists() {
        return path;
    }
    let tmp = dir.join(format!("{name}.tmp-{:?}", std::thread::current().id()));
    if gguf {
        synth::write_gguf(&tmp, spec).unwrap();
    } else {
        synth::write_hf(&tmp, spec).unwrap();
    }
    if std::fs::rename(&tmp, &path).is_err() {
        // Another thread finished first.
        let _ = std::fs::remove_dir_all(&tmp);
        let _ = std::fs::remove_file(&tmp);
    }
    path
}
