//! The forward's launches in order: embedding, every layer, and the head
//! over the picked rows.

use super::{CudaModel, GateUp, Mlp, Out, Plan};
use crate::launch::{opt_ptr, ptr, Launch};
use crate::Result;
use cudarc::driver::LaunchConfig;
use tensorfold_models::RopeStyle;

impl CudaModel {
    /// Queues the whole forward of `plan`: embedding, every layer, and the
    /// head over the picked rows. Its launches depend on the plan's shape
    /// and buffers only (positions, tokens and caches are read from `meta`
    /// on the device), which is what lets a captured graph be replayed.
    pub(super) fn enqueue(&self, p: &Plan) -> Result<()> {
        let c = &self.config;
        let st = &self.stream;
        let (h, ff, vocab) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let m = p.m;
        let (x, xn, qkv, q, attn, gu, act) = (p.x, p.xn, p.qkv, p.q, p.attn, p.gu, p.act);
        let (xn16, attn16, act16) = (p.xn16, p.attn16, p.act16);
        let (cos, sin) = (p.cos, p.sin);
        let tokens_p = p.tokens;
        self.mark_start()?;
        {
            let (code, wp, hk) = (self.embed.code as i32, ptr(&self.embed.data, st), h as i32);
            let scale = match c.plan.embed_scale {
                true => (h as f32).sqrt(),
                false => 1.0,
            };
            let mut b = Launch::new(&self.k.embed);
            b.arg(&code)
                .arg(&wp)
                .arg(&tokens_p)
                .arg(&x)
                .arg(&hk)
                .arg(&scale);
            let cfg = LaunchConfig {
                grid_dim: (m as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: matches `embed` in ops.cu; tokens were checked against
            // the vocabulary, `x` holds `m * h` floats.
            unsafe { b.launch(&self.stream, cfg, self.k.early) }?;
            self.mark(|| "embed".into())?;
        }

        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let eps = c.rms_eps;
        let interleaved = (c.rope_style == RopeStyle::Interleaved) as i32;
        for (l, b) in self.blocks.iter().enumerate() {
            let layer = l as i32;
            let sliding = c.plan.sliding_window.is_some_and(|w| w.applies_to(l));
            let (cos, sin) = match sliding {
                true => (p.local_cos, p.local_sin),
                false => (cos, sin),
            };
            self.rmsnorm(x, 0, ptr(&b.attn_norm, st), xn, xn16, m, h)?;
            self.linear(&b.qkv, xn, xn16, qkv, m)?;
            {
                let (qb, kb, vb) = (
                    opt_ptr(&b.q_bias, st),
                    opt_ptr(&b.k_bias, st),
                    opt_ptr(&b.v_bias, st),
                );
                let (qn, kn) = (opt_ptr(&b.q_norm, st), opt_ptr(&b.k_norm, st));
                let mut lb = Launch::new(&self.k.qkv_post);
                lb.arg(&qkv)
                    .arg(&heads)
                    .arg(&kv_heads)
                    .arg(&hd)
                    .arg(&qb)
                    .arg(&kb)
                    .arg(&vb)
                    .arg(&qn)
                    .arg(&kn)
                    .arg(&eps)
                    .arg(&cos)
                    .arg(&sin)
                    .arg(&interleaved);
                p.cache_args(&mut lb);
                lb.arg(&layer).arg(&q);
                let cfg = LaunchConfig {
                    grid_dim: (m as u32, (c.heads + 2 * c.kv_heads) as u32, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: matches `qkv_post` in ops.cu; every row's position
                // is below its cache's capacity (reserved above) and the
                // rope tables cover it.
                unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
                self.mark(|| "qkv_post".into())?;
            }
            self.attention(p, layer)?;
            self.residual_add(&b.post_attn_norm, p, m, |out, mode| {
                self.matmul(&b.o, attn, attn16, out, m, h, mode)
            })?;
            self.rmsnorm(x, 0, ptr(&b.ffn_norm, st), xn, xn16, m, h)?;
            match &b.mlp {
                Mlp::Experts(e) => self.mixture(e, xn, xn16, x, m)?,
                Mlp::Dense { gate_up, down } => {
                    match gate_up {
                        GateUp::Gated(w) => {
                            self.matmul(w, xn, xn16, act, m, ff, Out::Gated(act16))?
                        }
                        GateUp::Split(l) => {
                            self.linear(l, xn, xn16, gu, m)?;
                            self.gated_mul(gu, act, act16, m, ff)?;
                        }
                    }
                    self.residual_add(&b.post_ffn_norm, p, m, |out, mode| {
                        self.matmul(down, act, act16, out, m, h, mode)
                    })?;
                }
            }
        }

        if p.picks > 0 {
            self.rmsnorm(
                x,
                p.pick,
                ptr(&self.norm, st),
                p.picked,
                p.picked16,
                p.picks,
                h,
            )?;
            let head = self.head.as_ref().unwrap_or(&self.embed);
            self.matmul(
                head,
                p.picked,
                p.picked16,
                p.logits,
                p.picks,
                vocab,
                Out::Set,
            )?;
            if let Some(cap) = c.plan.final_softcap {
                let n = (p.picks * vocab) as i64;
                let mut lb = Launch::new(&self.k.softcap);
                lb.arg(&p.logits).arg(&n).arg(&cap);
                let cfg = LaunchConfig {
                    grid_dim: ((n as usize).div_ceil(256) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: matches `softcap` in ops.cu; `logits` holds the
                // picked rows' `n` logits.
                unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
                self.mark(|| "softcap".into())?;
            }
        }
        Ok(())
    }
}
