//! Qwen2 (and Qwen2.5, Qwen2.5-Coder): a Llama block with biases on the q,
//! k and v projections. GGUF keeps the Hugging Face rotary layout (halves).

use super::{any, baseline, hf_baseline, llama_names, qwen_expert, Family};
use crate::config::{Arch, RopeStyle};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen2,
    name: "qwen2",
    gguf_name: "qwen2",
    hf_class: "Qwen2ForCausalLM",
    qkv_bias: true,
    qk_norm: false,
    gguf_rope: RopeStyle::Half,
    gguf_matches: any,
    gguf_plan: baseline,
    hf_plan: hf_baseline,
    hf_name: llama_names,
    hf_expert: qwen_expert,
    fused: false,
};
