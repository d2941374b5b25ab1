//! What the fuzz targets share: scratch files for the loaders, which read
//! paths, and a tiny random model for the targets that need one.

use std::path::PathBuf;
use std::sync::OnceLock;
use tensorfold_models::synth::{write_gguf, write_hf, SynthSpec};
use tensorfold_models::{Arch, Format};

/// A per-process scratch directory (in memory where Linux offers it).
pub fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        let base = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("tensorfold-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

/// A Hugging Face directory of a tiny random Llama (its `config.json` and
/// `model.safetensors` are what the targets replace).
pub fn tiny_hf_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch().join("tiny-hf");
        write_hf(&dir, &SynthSpec::tiny(Arch::Llama, Format::F32, 1)).expect("tiny model");
        dir
    })
}

/// A tiny random GGUF model.
pub fn tiny_gguf() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = scratch().join("tiny.gguf");
        write_gguf(&path, &SynthSpec::tiny(Arch::Qwen2, Format::Q8_0, 1)).expect("tiny model");
        path
    })
}
