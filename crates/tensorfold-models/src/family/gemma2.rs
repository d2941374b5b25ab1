//! Gemma 2: the Gemma block ([`super::gemma`]), head dim 256, attention
//! and final logits soft-capped (`cap * tanh(x / cap)`), and every other
//! layer (the even ones) attending through a sliding window.

use super::gemma::{base, gguf_query_scale_dim, hf_name, query_scale_dim};
use super::{any, gguf_count, gguf_need, hf_global_every, qwen_expert, Family};
use crate::config::{Arch, RopeStyle};
use crate::error::Result;
use crate::gguf::Metadata;
use crate::plan::{NormKind, Plan, SlidingWindow};
use serde_json::Value;

const GGUF: &str = "gemma2";

pub const FAMILY: Family = Family {
    arch: Arch::Gemma2,
    name: "gemma2",
    gguf_name: GGUF,
    hf_class: "Gemma2ForCausalLM",
    qkv_bias: false,
    qk_norm: false,
    gguf_rope: RopeStyle::Half,
    gguf_matches: any,
    gguf_plan,
    hf_plan,
    hf_name,
    hf_expert: qwen_expert,
    fused: false,
};

fn gguf_plan(md: &Metadata<'_>) -> Result<Plan> {
    let cap = |k: &str| md.f64(&format!("{GGUF}.{k}")).map(|v| v as f32);
    let (layers, hidden, heads) = (
        gguf_need(md, GGUF, "block_count")?,
        gguf_need(md, GGUF, "embedding_length")?,
        gguf_need(md, GGUF, "attention.head_count")?,
    );
    Ok(Plan {
        // llama.cpp's default window when the file states none.
        sliding_window: Some(SlidingWindow {
            size: gguf_count(md, GGUF, "attention.sliding_window").unwrap_or(4096),
            global_every: Some(
                gguf_count(md, GGUF, "attention.sliding_window_pattern").unwrap_or(2),
            ),
        }),
        local_rope_theta: md.f64(&format!("{GGUF}.rope.freq_base_swa")),
        attn_softcap: cap("attn_logit_softcapping"),
        final_softcap: cap("final_logit_softcapping"),
        query_scale_dim: gguf_query_scale_dim(layers, hidden, heads),
        ..base(NormKind::Rms)
    })
}

fn hf_plan(c: &Value) -> Result<Plan> {
    let cap = |k: &str| c[k].as_f64().map(|v| v as f32);
    let every = hf_global_every(c)?;
    Ok(Plan {
        sliding_window: c["sliding_window"].as_u64().map(|size| SlidingWindow {
            size: size as usize,
            // Every other layer, unless `layer_types` says otherwise.
            global_every: every.unwrap_or(Some(2)),
        }),
        attn_softcap: cap("attn_logit_softcapping"),
        final_softcap: cap("final_logit_softcapping"),
        query_scale_dim: query_scale_dim(c),
        ..base(NormKind::RmsOffset)
    })
}
