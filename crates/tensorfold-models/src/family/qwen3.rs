//! Qwen3: no projection biases; instead an RMSNorm over each head of q and
//! k (weights of `head_dim`) before rotation. `head_dim` is explicit and
//! need not be `hidden_size / heads`.

use super::{any, baseline, hf_baseline, llama_names, qwen_expert, Family};
use crate::config::{Arch, RopeStyle};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3,
    name: "qwen3",
    gguf_name: "qwen3",
    hf_class: "Qwen3ForCausalLM",
    qkv_bias: false,
    qk_norm: true,
    gguf_rope: RopeStyle::Half,
    gguf_matches: any,
    gguf_plan: baseline,
    hf_plan: hf_baseline,
    hf_name: llama_names,
    hf_expert: qwen_expert,
    fused: false,
};
