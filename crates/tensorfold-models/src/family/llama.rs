//! Llama: pre-norm blocks, grouped-query attention without biases, SwiGLU
//! MLP, RMSNorm. SmolLM2 and mathformer are Llamas.
//!
//! llama.cpp's converter permutes the q and k rows of Llama checkpoints so
//! that GGUF files rotate interleaved pairs; Hugging Face files rotate
//! halves. A config's `attention_bias: true` is honoured as in transformers.
//! A `llama` GGUF with experts is Mixtral (`mixtral.rs`).

use super::{baseline, has_experts, hf_baseline, llama_names, qwen_expert, Family};
use crate::config::{Arch, RopeStyle};

pub const FAMILY: Family = Family {
    arch: Arch::Llama,
    name: "llama",
    gguf_name: "llama",
    hf_class: "LlamaForCausalLM",
    qkv_bias: false,
    qk_norm: false,
    gguf_rope: RopeStyle::Interleaved,
    gguf_matches: |md| !has_experts(md, "llama"),
    gguf_plan: baseline,
    hf_plan: hf_baseline,
    hf_name: llama_names,
    hf_expert: qwen_expert,
    fused: false,
};
