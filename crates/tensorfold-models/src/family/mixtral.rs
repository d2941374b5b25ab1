//! Mixtral: a Llama block (GGUF architecture `llama`, told apart by
//! `llama.expert_count`) whose MLP is a routed mixture of SwiGLU experts:
//! the top `used` of a softmax over every expert, renormalized.
//!
//! Hugging Face: `block_sparse_moe.gate` (router) and
//! `block_sparse_moe.experts.E.{w1,w3,w2}` (gate, up, down).

use super::{expert_part, gguf_need, has_experts, hf_need, Family};
use crate::config::{Arch, RopeStyle};
use crate::error::Result;
use crate::gguf::Metadata;
use crate::plan::{Experts, Plan, SlidingWindow};
use serde_json::Value;

const GGUF: &str = "llama";

pub const FAMILY: Family = Family {
    arch: Arch::Mixtral,
    name: "mixtral",
    gguf_name: GGUF,
    hf_class: "MixtralForCausalLM",
    qkv_bias: false,
    qk_norm: false,
    gguf_rope: RopeStyle::Interleaved,
    gguf_matches: |md| has_experts(md, GGUF),
    gguf_plan,
    hf_plan,
    hf_name: router_name,
    hf_expert,
    fused: false,
};

fn gguf_plan(md: &Metadata<'_>) -> Result<Plan> {
    Ok(Plan {
        experts: Some(Experts {
            count: gguf_need(md, GGUF, "expert_count")?,
            used: gguf_need(md, GGUF, "expert_used_count")?,
            ff: gguf_need(md, GGUF, "feed_forward_length")?,
            norm_top_k: true,
        }),
        ..Plan::default()
    })
}

fn hf_plan(c: &Value) -> Result<Plan> {
    Ok(Plan {
        experts: Some(Experts {
            count: hf_need(c, "num_local_experts")?,
            used: hf_need(c, "num_experts_per_tok")?,
            ff: hf_need(c, "intermediate_size")?,
            norm_top_k: true,
        }),
        sliding_window: c["sliding_window"].as_u64().map(|size| SlidingWindow {
            size: size as usize,
            global_every: None,
        }),
        ..Plan::default()
    })
}

fn router_name(gguf: &str) -> Option<String> {
    let layer = gguf
        .strip_prefix("blk.")?
        .strip_suffix(".ffn_gate_inp.weight")?;
    Some(format!("model.layers.{layer}.block_sparse_moe.gate.weight"))
}

fn hf_expert(gguf: &str, e: usize) -> String {
    let (layer, part) = expert_part(gguf);
    let w = match part {
        "gate" => "w1",
        "down" => "w2",
        _ => "w3",
    };
    format!("model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight")
}
