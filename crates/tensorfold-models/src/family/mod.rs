//! What distinguishes each supported family. The forward itself is shared
//! ([`crate::decoder`]); a family only switches its parts on and off and
//! says how its files name it.

mod llama;
mod qwen2;
mod qwen3;

use crate::config::{Arch, RopeStyle};

/// A family's traits.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub arch: Arch,
    /// `general.architecture` in GGUF.
    pub gguf_name: &'static str,
    /// `architectures[0]` in a Hugging Face `config.json`.
    pub hf_class: &'static str,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// Rotary pairing of the GGUF conversion (Hugging Face files are always
    /// [`RopeStyle::Half`]).
    pub gguf_rope: RopeStyle,
}

pub const FAMILIES: [Family; 3] = [llama::FAMILY, qwen2::FAMILY, qwen3::FAMILY];

pub fn by_gguf_name(name: &str) -> Option<Family> {
    FAMILIES.iter().copied().find(|f| f.gguf_name == name)
}

pub fn by_hf_class(name: &str) -> Option<Family> {
    FAMILIES.iter().copied().find(|f| f.hf_class == name)
}

/// The names accepted, for error messages.
pub fn supported() -> String {
    FAMILIES
        .iter()
        .map(|f| format!("{} ({})", f.gguf_name, f.hf_class))
        .collect::<Vec<_>>()
        .join(", ")
}
