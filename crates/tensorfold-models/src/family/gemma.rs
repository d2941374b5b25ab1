//! What Gemma 2 and Gemma 3 share: (1+w) RMSNorm in Hugging Face files (GGUF
//! files store `1+w`, llama.cpp's converter adds the one), GELU(tanh)
//! gated MLP, embeddings scaled by `sqrt(hidden_size)`, norms after
//! attention and after the MLP, tied embeddings, rotation by halves, and
//! their own Hugging Face names for the four block norms.

use crate::plan::{Activation, NormKind, Plan};

/// The Gemma plan for a layout whose norm weights are stored as `norm`.
pub(crate) fn base(norm: NormKind) -> Plan {
    Plan {
        norm,
        activation: Activation::GeluTanh,
        embed_scale: true,
        post_norms: true,
        ..Plan::default()
    }
}

/// Gemma's Hugging Face names of the block norms.
pub(crate) fn hf_name(gguf: &str) -> Option<String> {
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let module = match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{module}"))
}

/// llama.cpp's query scale: `1/sqrt(hidden/heads)` for the 27B shapes,
/// `1/sqrt(head_dim)` otherwise.
pub(crate) fn gguf_query_scale_dim(layers: usize, hidden: usize, heads: usize) -> Option<usize> {
    (layers == 46 || layers == 62).then(|| hidden / heads.max(1))
}

/// `query_pre_attn_scalar` where it is not the head dimension.
pub(crate) fn query_scale_dim(c: &serde_json::Value) -> Option<usize> {
    let dim = c["query_pre_attn_scalar"].as_u64()?;
    (c["head_dim"].as_u64() != Some(dim)).then_some(dim as usize)
}
