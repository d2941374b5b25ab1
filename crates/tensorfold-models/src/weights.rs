//! Building a [`Model`] from any source of named tensors.
//!
//! Sources answer in GGUF's tensor names (`blk.0.attn_q.weight`); the
//! Hugging Face source translates them.

use crate::config::ModelConfig;
use crate::decoder::{Block, Model};
use crate::error::{ModelError, Result};
use tensorfold_quant::Matrix;

/// A file's tensors, by GGUF name.
pub trait TensorSource {
    /// A 2-D weight with the given shape.
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix>;
    /// A 1-D f32 vector of the given length.
    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let m = self.matrix(name, 1, len)?;
        let mut v = vec![0f32; len];
        m.row_f32(0, &mut v);
        Ok(v)
    }
}

fn optional(
    src: &mut dyn TensorSource,
    name: &str,
    len: usize,
    wanted: bool,
) -> Result<Option<Vec<f32>>> {
    if wanted {
        src.vector(name, len).map(Some)
    } else {
        Ok(None)
    }
}

pub(crate) fn build(config: ModelConfig, src: &mut dyn TensorSource) -> Result<Model> {
    config.validate().map_err(ModelError::Malformed)?;
    let c = &config;
    let (h, qw, kvw, ff) = (
        c.hidden_size,
        c.q_width(),
        c.kv_width(),
        c.intermediate_size,
    );
    let embed = src.matrix("token_embd.weight", c.vocab_size, h)?;
    let mut blocks = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        blocks.push(Block {
            attn_norm: src.vector(&n("attn_norm.weight"), h)?,
            q: src.matrix(&n("attn_q.weight"), qw, h)?,
            k: src.matrix(&n("attn_k.weight"), kvw, h)?,
            v: src.matrix(&n("attn_v.weight"), kvw, h)?,
            o: src.matrix(&n("attn_output.weight"), h, qw)?,
            q_bias: optional(src, &n("attn_q.bias"), qw, c.qkv_bias)?,
            k_bias: optional(src, &n("attn_k.bias"), kvw, c.qkv_bias)?,
            v_bias: optional(src, &n("attn_v.bias"), kvw, c.qkv_bias)?,
            q_norm: optional(src, &n("attn_q_norm.weight"), c.head_dim, c.qk_norm)?,
            k_norm: optional(src, &n("attn_k_norm.weight"), c.head_dim, c.qk_norm)?,
            ffn_norm: src.vector(&n("ffn_norm.weight"), h)?,
            gate: src.matrix(&n("ffn_gate.weight"), ff, h)?,
            up: src.matrix(&n("ffn_up.weight"), ff, h)?,
            down: src.matrix(&n("ffn_down.weight"), h, ff)?,
        });
    }
    let norm = src.vector("output_norm.weight", h)?;
    let lm_head = if c.tied_embeddings {
        None
    } else {
        Some(src.matrix("output.weight", c.vocab_size, h)?)
    };
    Ok(Model {
        config,
        embed,
        blocks,
        norm,
        lm_head,
    })
}
