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

/// The first of `keys` that `config.json` has, as a count (transformers
/// has renamed some between versions).
pub(crate) fn hf_need_any(c: &Value, keys: &[&str]) -> Result<usize> {
    keys.iter()
        .find_map(|k| c[*k].as_u64())
        .map(|v| v as usize)
        .ok_or_else(|| ModelError::Malformed(format!("config.json lacks {}", keys.join(" or "))))
}

/// The rotary base of a layer type (`full_attention`, `sliding_attention`)
/// where `config.json` gives one per type (transformers 5's
/// `rope_parameters`), else `None`.
pub(crate) fn hf_layer_rope_theta(c: &Value, layer_type: &str) -> Option<f64> {
    c["rope_parameters"][layer_type]["rope_theta"].as_f64()
}

/// Which layers slide, from `layer_types` (transformers 5): `None` where
/// the key is absent, else every `n`-th layer global (`Some(n)`) or every
/// layer sliding (`None` inside); another pattern is refused.
pub(crate) fn hf_global_every(c: &Value) -> Result<Option<Option<usize>>> {
    let Some(types) = c["layer_types"].as_array() else {
        return Ok(None);
    };
    let full: Vec<bool> = types
        .iter()
        .map(|t| t.as_str() == Some("full_attention"))
        .collect();
    let Some(first) = full.iter().position(|f| *f) else {
        return Ok(Some(None));
    };
    let every = first + 1;
    let periodic = full
        .iter()
        .enumerate()
        .all(|(i, f)| *f == (i + 1).is_multiple_of(every));
    if !periodic {
        return Err(ModelError::Unsupported(format!(
            "layer_types {types:?}: TensorFold runs a global layer every n layers, or none"
        )));
    }
    Ok(Some(Some(every)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn layer_types_give_the_global_layers_or_a_clear_refusal() {
        let types = |t: &[&str]| json!({ "layer_types": t });
        let (s, f) = ("sliding_attention", "full_attention");
        assert_eq!(hf_global_every(&json!({})).unwrap(), None);
        assert_eq!(
            hf_global_every(&types(&[s, s, f, s, s, f])).unwrap(),
            Some(Some(3))
        );
        assert_eq!(hf_global_every(&types(&[s, s])).unwrap(), Some(None));
        assert!(hf_global_every(&types(&[f, s])).is_err());
        assert!(hf_global_every(&types(&[s, f, f, s])).is_err());
    }

    #[test]
    fn per_type_rope_bases_and_renamed_counts_are_read() {
        let c = json!({
            "rope_parameters": {
                "full_attention": { "rope_theta": 1e6 },
                "sliding_attention": { "rope_theta": 1e4 },
            },
            "num_local_experts": 8,
        });
        assert_eq!(hf_layer_rope_theta(&c, "full_attention"), Some(1e6));
        assert_eq!(hf_layer_rope_theta(&c, "sliding_attention"), Some(1e4));
        assert_eq!(
            hf_need_any(&c, &["num_experts", "num_local_experts"]).unwrap(),
            8
        );
        assert!(hf_need_any(&c, &["num_experts"]).is_err());
    }
}
