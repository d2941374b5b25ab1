//! One file per supported family: how its files name it, its configuration
//! (GGUF keys and Hugging Face `config.json`), its tensor names where they
//! differ from Llama's, and its block [`Plan`]. The forward is shared
//! ([`crate::decoder`]) and interprets the plan.

mod gemma;
mod gemma2;
mod gemma3;
mod llama;
mod mistral;
mod mixtral;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3moe;

use crate::config::{Arch, RopeStyle};
use crate::error::{ModelError, Result};
use crate::gguf::Metadata;
use crate::plan::Plan;
use serde_json::Value;

/// A family's traits.
#[derive(Clone, Copy)]
pub struct Family {
    pub arch: Arch,
    /// Short name.
    pub name: &'static str,
    /// `general.architecture` in GGUF (several families may share one).
    pub gguf_name: &'static str,
    /// `architectures[0]` in a Hugging Face `config.json`.
    pub hf_class: &'static str,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// Rotary pairing of the GGUF conversion (Hugging Face files are always
    /// [`RopeStyle::Half`]).
    pub gguf_rope: RopeStyle,
    /// Whether a GGUF file of `gguf_name` is this family.
    pub gguf_matches: fn(&Metadata<'_>) -> bool,
    /// The plan from GGUF metadata.
    pub gguf_plan: fn(&Metadata<'_>) -> Result<Plan>,
    /// The plan from `config.json`.
    pub hf_plan: fn(&Value) -> Result<Plan>,
    /// The Hugging Face name of a GGUF tensor name where this family's
    /// differs from Llama's (see `hf::hf_name_of`).
    pub hf_name: fn(&str) -> Option<String>,
    /// The Hugging Face name of expert `e`'s matrix of a GGUF expert
    /// tensor name (`blk.L.ffn_gate_exps.weight`).
    pub hf_expert: fn(&str, usize) -> String,
    /// Weights stored fused: q|k|v in `attn_qkv`, gate|up in `ffn_up`.
    pub fused: bool,
}

/// GGUF lookup order: a family whose `gguf_matches` is narrower comes
/// before the one that shares its architecture name (Mixtral before Llama).
pub const FAMILIES: [Family; 9] = [
    mixtral::FAMILY,
    llama::FAMILY,
    mistral::FAMILY,
    qwen2::FAMILY,
    qwen3::FAMILY,
    qwen3moe::FAMILY,
    phi3::FAMILY,
    gemma2::FAMILY,
    gemma3::FAMILY,
];

pub fn of(arch: Arch) -> &'static Family {
    FAMILIES
        .iter()
        .find(|f| f.arch == arch)
        .expect("every arch has a family")
}

pub fn by_gguf(name: &str, md: &Metadata<'_>) -> Option<Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.gguf_name == name && (f.gguf_matches)(md))
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

// Pieces the family files share.

/// Matches every file of the architecture name.
pub(crate) fn any(_: &Metadata<'_>) -> bool {
    true
}

/// The baseline plan, from GGUF metadata.
pub(crate) fn baseline(_: &Metadata<'_>) -> Result<Plan> {
    Ok(Plan::default())
}

/// The baseline plan, from `config.json`.
pub(crate) fn hf_baseline(_: &Value) -> Result<Plan> {
    Ok(Plan::default())
}

/// No names of its own.
pub(crate) fn llama_names(_: &str) -> Option<String> {
    None
}

/// `{arch}.{key}` as a count.
pub(crate) fn gguf_count(md: &Metadata<'_>, arch: &str, key: &str) -> Option<usize> {
    md.usize(&format!("{arch}.{key}"))
}

pub(crate) fn gguf_need(md: &Metadata<'_>, arch: &str, key: &str) -> Result<usize> {
    gguf_count(md, arch, key)
        .ok_or_else(|| ModelError::Malformed(format!("GGUF metadata lacks {arch}.{key}")))
}

pub(crate) fn hf_need(c: &Value, key: &str) -> Result<usize> {
    c[key]
        .as_u64()
        .map(|v| v as usize)
        .ok_or_else(|| ModelError::Malformed(format!("config.json lacks {key}")))
}

/// A file of an architecture whose experts this family does not route.
pub(crate) fn has_experts(md: &Metadata<'_>, arch: &str) -> bool {
    gguf_count(md, arch, "expert_count").is_some_and(|n| n > 0)
}

/// The layer and part (`gate`, `up`, `down`) of a GGUF expert tensor name.
pub(crate) fn expert_part(gguf: &str) -> (&str, &str) {
    let rest = gguf.strip_prefix("blk.").unwrap_or(gguf);
    let (layer, rest) = rest.split_once('.').unwrap_or((rest, ""));
    let part = rest
        .strip_prefix("ffn_")
        .and_then(|p| p.strip_suffix("_exps.weight"))
        .unwrap_or(rest);
    (layer, part)
}

/// `mlp.experts.E.{part}_proj` naming (Qwen MoE).
pub(crate) fn qwen_expert(gguf: &str, e: usize) -> String {
    let (layer, part) = expert_part(gguf);
    format!("model.layers.{layer}.mlp.experts.{e}.{part}_proj.weight")
}

/// The families that route experts, for error messages.
pub fn with_experts() -> String {
    FAMILIES
        .iter()
        .filter(|f| f.hf_class.contains("Moe") || f.arch == Arch::Mixtral)
        .map(|f| f.name)
        .collect::<Vec<_>>()
        .join(", ")
}
