//! Phi-3 (mini, medium): a Llama block whose q, k and v are one matrix
//! (`attn_qkv` / `qkv_proj`, rows q|k|v) and whose gate and up are one
//! (`ffn_up` / `gate_up_proj`, rows gate|up); rotation by halves. The
//! 128k variants' rope scaling is refused.

use super::{any, baseline, qwen_expert, Family};
use crate::config::{Arch, RopeStyle};
use crate::error::{ModelError, Result};
use crate::plan::Plan;
use serde_json::Value;

pub const FAMILY: Family = Family {
    arch: Arch::Phi3,
    name: "phi3",
    gguf_name: "phi3",
    hf_class: "Phi3ForCausalLM",
    qkv_bias: false,
    qk_norm: false,
    gguf_rope: RopeStyle::Half,
    gguf_matches: any,
    gguf_plan: baseline,
    hf_plan,
    hf_name,
    hf_expert: qwen_expert,
    fused: true,
};

fn hf_plan(c: &Value) -> Result<Plan> {
    if c["partial_rotary_factor"]
        .as_f64()
        .is_some_and(|f| f != 1.0)
    {
        return Err(ModelError::Unsupported(
            "Phi3ForCausalLM with a partial rotary factor".into(),
        ));
    }
    Ok(Plan::default())
}

fn hf_name(gguf: &str) -> Option<String> {
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let module = match part {
        "attn_qkv.weight" => "self_attn.qkv_proj.weight",
        "ffn_up.weight" => "mlp.gate_up_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{module}"))
}
