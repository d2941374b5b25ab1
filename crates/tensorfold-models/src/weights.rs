//! Building a [`Model`] from any source of named tensors, as the model's
//! family and plan say: the one list of a block's weights.
//!
//! Sources answer in GGUF's tensor names (`blk.0.attn_q.weight`); the
//! Hugging Face source translates them.

use crate::config::ModelConfig;
use crate::decoder::{Block, Model};
use crate::error::{ModelError, Result};
use crate::family;
use crate::moe::ExpertWeights;
use crate::plan::NormKind;
use tensorfold_quant::{Format, Matrix, Storage};

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
    /// Expert `e` (of `count`) of the expert tensor `name`
    /// (`blk.L.ffn_gate_exps.weight`), `rows x cols`.
    fn expert(
        &mut self,
        name: &str,
        e: usize,
        count: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix>;
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

/// A norm's weights as the forward multiplies them: `1 + w` where the file
/// stores `w` around zero, computed once in f32 as the reference does.
fn norm(src: &mut dyn TensorSource, name: &str, len: usize, kind: NormKind) -> Result<Vec<f32>> {
    let mut w = src.vector(name, len)?;
    if kind == NormKind::RmsOffset {
        w.iter_mut().for_each(|v| *v += 1.0);
    }
    Ok(w)
}

/// Cuts a matrix into consecutive row ranges of the given heights (fused
/// projections). Rows are whole blocks, so the cut is exact.
fn split_rows(m: Matrix, heights: &[usize]) -> Result<Vec<Matrix>> {
    let cols = m.cols();
    let (format, bytes): (Format, Vec<u8>) = match m.storage() {
        Storage::F32(v) => (
            Format::F32,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        Storage::F16(v) => (
            Format::F16,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        Storage::Bf16(v) => (
            Format::Bf16,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        Storage::Ggml(b) => (b.format(), b.as_bytes().to_vec()),
        Storage::Affine(_) => {
            return Err(ModelError::Unsupported(
                "fused projections in affine-packed weights".into(),
            ))
        }
    };
    let mut out = Vec::with_capacity(heights.len());
    let mut at = 0;
    for &rows in heights {
        let len = format.matrix_bytes(rows, cols);
        out.push(Matrix::from_bytes(
            format,
            rows,
            cols,
            &bytes[at..at + len],
        )?);
        at += len;
    }
    Ok(out)
}

fn empty(cols: usize) -> Result<Matrix> {
    Ok(Matrix::from_f32(Format::F32, 0, cols, &[])?)
}

pub(crate) fn build(config: ModelConfig, src: &mut dyn TensorSource) -> Result<Model> {
    config.validate().map_err(ModelError::Malformed)?;
    let c = &config;
    let fam = family::of(c.arch);
    let plan = c.plan;
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
        let (q, k, v) = if fam.fused {
            let qkv = src.matrix(&n("attn_qkv.weight"), qw + 2 * kvw, h)?;
            let [q, k, v]: [Matrix; 3] = split_rows(qkv, &[qw, kvw, kvw])?
                .try_into()
                .map_err(|_| ModelError::Malformed("qkv split".into()))?;
            (q, k, v)
        } else {
            (
                src.matrix(&n("attn_q.weight"), qw, h)?,
                src.matrix(&n("attn_k.weight"), kvw, h)?,
                src.matrix(&n("attn_v.weight"), kvw, h)?,
            )
        };
        let (gate, up, down, experts) = match plan.experts {
            Some(e) => {
                let mut each = |part: &str, rows, cols| {
                    (0..e.count)
                        .map(|x| {
                            src.expert(
                                &n(&format!("ffn_{part}_exps.weight")),
                                x,
                                e.count,
                                rows,
                                cols,
                            )
                        })
                        .collect::<Result<Vec<_>>>()
                };
                let weights = ExpertWeights {
                    gate: each("gate", e.ff, h)?,
                    up: each("up", e.ff, h)?,
                    down: each("down", h, e.ff)?,
                    router: src.matrix(&n("ffn_gate_inp.weight"), e.count, h)?,
                };
                (empty(h)?, empty(h)?, empty(0)?, Some(weights))
            }
            None if fam.fused => {
                let gate_up = src.matrix(&n("ffn_up.weight"), 2 * ff, h)?;
                let [gate, up]: [Matrix; 2] = split_rows(gate_up, &[ff, ff])?
                    .try_into()
                    .map_err(|_| ModelError::Malformed("gate|up split".into()))?;
                (gate, up, src.matrix(&n("ffn_down.weight"), h, ff)?, None)
            }
            None => (
                src.matrix(&n("ffn_gate.weight"), ff, h)?,
                src.matrix(&n("ffn_up.weight"), ff, h)?,
                src.matrix(&n("ffn_down.weight"), h, ff)?,
                None,
            ),
        };
        let post = |src: &mut dyn TensorSource, name: &str| -> Result<Option<Vec<f32>>> {
            if plan.post_norms {
                norm(src, &n(name), h, plan.norm).map(Some)
            } else {
                Ok(None)
            }
        };
        let head_norm = |src: &mut dyn TensorSource, name: &str| -> Result<Option<Vec<f32>>> {
            if c.qk_norm {
                norm(src, &n(name), c.head_dim, plan.norm).map(Some)
            } else {
                Ok(None)
            }
        };
        blocks.push(Block {
            attn_norm: norm(src, &n("attn_norm.weight"), h, plan.norm)?,
            q,
            k,
            v,
            o: src.matrix(&n("attn_output.weight"), h, qw)?,
            q_bias: optional(src, &n("attn_q.bias"), qw, c.qkv_bias)?,
            k_bias: optional(src, &n("attn_k.bias"), kvw, c.qkv_bias)?,
            v_bias: optional(src, &n("attn_v.bias"), kvw, c.qkv_bias)?,
            q_norm: head_norm(src, "attn_q_norm.weight")?,
            k_norm: head_norm(src, "attn_k_norm.weight")?,
            post_attn_norm: post(src, "post_attention_norm.weight")?,
            ffn_norm: norm(src, &n("ffn_norm.weight"), h, plan.norm)?,
            gate,
            up,
            down,
            experts,
            post_ffn_norm: post(src, "post_ffw_norm.weight")?,
        });
    }
    let norm = norm(src, "output_norm.weight", h, plan.norm)?;
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
