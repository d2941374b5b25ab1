//! Mistral: a Llama block whose attention may slide over the last
//! `sliding_window` positions (Mistral 7B v0.1; later versions set none).
//! Its GGUF files are architecture `llama` and carry no window (llama.cpp
//! attends over the whole context), so the Llama family reads them.

use super::{baseline, llama_names, qwen_expert, Family};
use crate::config::{Arch, RopeStyle};
use crate::error::Result;
use crate::plan::{Plan, SlidingWindow};
use serde_json::Value;

pub const FAMILY: Family = Family {
    arch: Arch::Mistral,
    name: "mistral",
    gguf_name: "llama",
    hf_class: "MistralForCausalLM",
    qkv_bias: false,
    qk_norm: false,
    gguf_rope: RopeStyle::Interleaved,
    gguf_matches: |_| false,
    gguf_plan: baseline,
    hf_plan,
    hf_name: llama_names,
    hf_expert: qwen_expert,
    fused: false,
};

fn hf_plan(c: &Value) -> Result<Plan> {
    Ok(Plan {
        sliding_window: c["sliding_window"].as_u64().map(|size| SlidingWindow {
            size: size as usize,
            global_every: None,
        }),
        ..Plan::default()
    })
}
