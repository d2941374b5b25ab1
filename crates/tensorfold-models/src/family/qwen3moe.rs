//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3 block (q/k
//! RMSNorm, no biases) with a routed mixture of experts for the MLP. The
//! router's softmax runs over every expert, the top `used` are kept and,
//! with `norm_topk_prob`, renormalized.
//!
//! GGUF: `blk.L.ffn_gate_inp` (router), `blk.L.ffn_{gate,up,down}_exps`
//! (every expert in one tensor). Hugging Face: `mlp.gate`,
//! `mlp.experts.E.{gate,up,down}_proj`.

use super::{any, gguf_need, hf_need, hf_need_any, qwen_expert, Family};
use crate::config::{Arch, RopeStyle};
use crate::error::{ModelError, Result};
use crate::gguf::Metadata;
use crate::plan::{Experts, Plan};
use serde_json::Value;

const GGUF: &str = "qwen3moe";

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3Moe,
    name: "qwen3moe",
    gguf_name: GGUF,
    hf_class: "Qwen3MoeForCausalLM",
    qkv_bias: false,
    qk_norm: true,
    gguf_rope: RopeStyle::Half,
    gguf_matches: any,
    gguf_plan,
    hf_plan,
    hf_name: router_name,
    hf_expert: qwen_expert,
    fused: false,
};

fn gguf_plan(md: &Metadata<'_>) -> Result<Plan> {
    Ok(Plan {
        experts: Some(Experts {
            count: gguf_need(md, GGUF, "expert_count")?,
            used: gguf_need(md, GGUF, "expert_used_count")?,
            ff: gguf_need(md, GGUF, "expert_feed_forward_length")?,
            // llama.cpp renormalizes Qwen3-MoE's top-k weights always.
            norm_top_k: md
                .bool(&format!("{GGUF}.expert_weights_norm"))
                .unwrap_or(true),
        }),
        ..Plan::default()
    })
}

fn hf_plan(c: &Value) -> Result<Plan> {
    let sparse_step = c["decoder_sparse_step"].as_u64().unwrap_or(1);
    let dense_layers = c["mlp_only_layers"].as_array().map_or(0, Vec::len);
    if sparse_step != 1 || dense_layers != 0 {
        return Err(ModelError::Unsupported(
            "Qwen3MoeForCausalLM with dense layers (decoder_sparse_step or mlp_only_layers)".into(),
        ));
    }
    Ok(Plan {
        experts: Some(Experts {
            // `num_local_experts` from transformers 5 on.
            count: hf_need_any(c, &["num_experts", "num_local_experts"])?,
            used: hf_need(c, "num_experts_per_tok")?,
            ff: hf_need(c, "moe_intermediate_size")?,
            norm_top_k: c["norm_topk_prob"].as_bool().unwrap_or(false),
        }),
        ..Plan::default()
    })
}

fn router_name(gguf: &str) -> Option<String> {
    let layer = gguf
        .strip_prefix("blk.")?
        .strip_suffix(".ffn_gate_inp.weight")?;
    Some(format!("model.layers.{layer}.mlp.gate.weight"))
}
