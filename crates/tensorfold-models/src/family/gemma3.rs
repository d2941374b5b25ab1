//! Gemma 3 (text): the Gemma block ([`super::gemma`]) with an RMSNorm over
//! each head of q and k, five sliding-window layers to every global one,
//! and a separate rotary base (10000) for the sliding layers. Rope scaling
//! of the global layers (4B and larger) is refused.

use super::gemma::{base, gguf_query_scale_dim, hf_name, query_scale_dim};
use super::{
    any, gguf_count, gguf_need, hf_global_every, hf_layer_rope_theta, qwen_expert, Family,
};
use crate::config::{Arch, RopeStyle};
use crate::error::Result;
use crate::gguf::Metadata;
use crate::plan::{NormKind, Plan, SlidingWindow};
use serde_json::Value;

const GGUF: &str = "gemma3";

/// llama.cpp's and transformers' rotary base of the sliding layers.
const LOCAL_ROPE_THETA: f64 = 10_000.0;

const GLOBAL_EVERY: usize = 6;

pub const FAMILY: Family = Family {
    arch: Arch::Gemma3,
    name: "gemma3",
    gguf_name: GGUF,
    hf_class: "Gemma3ForCausalLM",
    qkv_bias: false,
    qk_norm: true,
    gguf_rope: RopeStyle::Half,
    gguf_matches: any,
    gguf_plan,
    hf_plan,
    hf_name,
    hf_expert: qwen_expert,
    fused: false,
};

fn gguf_plan(md: &Metadata<'_>) -> Result<Plan> {
    let (layers, hidden, heads) = (
        gguf_need(md, GGUF, "block_count")?,
        gguf_need(md, GGUF, "embedding_length")?,
        gguf_need(md, GGUF, "attention.head_count")?,
    );
    Ok(Plan {
        sliding_window: gguf_count(md, GGUF, "attention.sliding_window")
            .filter(|size| *size > 0)
            .map(|size| SlidingWindow {
                size,
                global_every: Some(
                    gguf_count(md, GGUF, "attention.sliding_window_pattern")
                        .unwrap_or(GLOBAL_EVERY),
                ),
            }),
        local_rope_theta: Some(
            md.f64(&format!("{GGUF}.rope.freq_base_swa"))
                .unwrap_or(LOCAL_ROPE_THETA),
        ),
        final_softcap: md
            .f64(&format!("{GGUF}.final_logit_softcapping"))
            .map(|v| v as f32)
            .filter(|v| *v != 0.0),
        query_scale_dim: gguf_query_scale_dim(layers, hidden, heads),
        ..base(NormKind::Rms)
    })
}

fn hf_plan(c: &Value) -> Result<Plan> {
    // `layer_types` (transformers 5) or the older `sliding_window_pattern`.
    let global_every = match hf_global_every(c)? {
        Some(every) => every,
        None => Some(
            c["sliding_window_pattern"]
                .as_u64()
                .map_or(GLOBAL_EVERY, |n| n as usize),
        ),
    };
    Ok(Plan {
        sliding_window: c["sliding_window"].as_u64().map(|size| SlidingWindow {
            size: size as usize,
            global_every,
        }),
        local_rope_theta: Some(
            c["rope_local_base_freq"]
                .as_f64()
                .or_else(|| hf_layer_rope_theta(c, "sliding_attention"))
                .unwrap_or(LOCAL_ROPE_THETA),
        ),
        final_softcap: c["final_logit_softcapping"].as_f64().map(|v| v as f32),
        attn_softcap: c["attn_logit_softcapping"].as_f64().map(|v| v as f32),
        query_scale_dim: query_scale_dim(c),
        ..base(NormKind::RmsOffset)
    })
}
