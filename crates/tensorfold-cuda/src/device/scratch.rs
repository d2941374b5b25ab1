//! The buffers a forward reuses, grown to the largest call seen: rows,
//! the split attention's partials and the rotary tables.

use super::{half_words, Bufs, CudaModel, Scratch};
use crate::attention;
use crate::pinned::pinned;
use crate::Result;
use cudarc::driver::CudaSlice;
use tensorfold_models::rotary_angle;

impl CudaModel {
    pub(super) fn ensure_scratch(
        &self,
        s: &mut Scratch,
        m: usize,
        picked: usize,
        meta: usize,
    ) -> Result<()> {
        if s.bufs.is_some() && m <= s.rows && picked <= s.picked && meta <= s.meta {
            return Ok(());
        }
        let c = &self.config;
        let (rows, pick, meta) = (m.max(s.rows), picked.max(s.picked).max(1), meta.max(s.meta));
        let (h, qw, kvw, ff) = (
            c.hidden_size,
            c.q_width(),
            c.kv_width(),
            c.intermediate_size,
        );
        let st = &self.stream;
        let half_words = |rows, width| half_words(st, rows, width);
        s.graphs.clear();
        s.bufs = None;
        s.bufs = Some(Bufs {
            x: st.alloc_zeros(rows * h)?,
            xn: st.alloc_zeros(rows * h)?,
            qkv: st.alloc_zeros(rows * (qw + 2 * kvw))?,
            q: st.alloc_zeros(rows * qw)?,
            attn: st.alloc_zeros(rows * qw)?,
            gu: st.alloc_zeros(rows * 2 * ff)?,
            act: st.alloc_zeros(rows * ff)?,
            proj: st.alloc_zeros(if c.plan.post_norms { rows * h } else { 1 })?,
            picked: st.alloc_zeros(pick * h)?,
            logits: st.alloc_zeros(pick * c.vocab_size)?,
            meta: st.alloc_zeros(meta)?,
            host_meta: pinned(&self.ctx, meta)?,
            xn16: half_words(rows, h)?,
            attn16: half_words(rows, qw)?,
            act16: half_words(rows, ff)?,
            picked16: half_words(pick, h)?,
        });
        (s.rows, s.picked, s.meta) = (rows, pick, meta);
        Ok(())
    }

    /// Blocks sharing each tensor-core attention tile of a call of `m` rows
    /// of `seqs` sequences reading at most `positions` keys: 1 is the
    /// fused form.
    pub(super) fn attention_splits(&self, m: usize, seqs: usize, positions: usize) -> usize {
        if !self.k.split_attention || self.tc_attention().is_none() {
            return 1;
        }
        let c = &self.config;
        let (rows, heads) = attention::tile(m, seqs, c.heads / c.kv_heads);
        let tiles = m.div_ceil(rows) * (c.heads / heads);
        attention::splits(
            m,
            tiles,
            attention::key_blocks(positions),
            self.k.multiprocessors,
        )
    }

    /// Room for the split attention's partials over `key_blocks` key blocks.
    pub(super) fn ensure_partials(&self, s: &mut Scratch, key_blocks: usize) -> Result<()> {
        if s.partials.is_some() && key_blocks <= s.partial_blocks {
            return Ok(());
        }
        let c = &self.config;
        let blocks = key_blocks.next_power_of_two().max(2 * s.partial_blocks);
        s.graphs.clear();
        s.partials = None;
        s.partials = Some(self.stream.alloc_zeros(attention::partial_floats(
            attention::SPLIT_ROWS,
            c.heads,
            blocks,
            c.head_dim,
        ))?);
        s.partial_blocks = blocks;
        Ok(())
    }

    /// Cosine and sine tables for positions `0..len`, computed in f64 from
    /// the position alone exactly as the CPU forward does.
    pub(super) fn ensure_rope(&self, s: &mut Scratch, need: usize) -> Result<()> {
        if s.rope.is_some() && need <= s.rope_len {
            return Ok(());
        }
        let c = &self.config;
        let len = need.max(2 * s.rope_len).max(c.max_positions.min(1 << 15));
        let table = |theta: f64| -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
            let half = c.head_dim / 2;
            let (mut cos, mut sin) = (
                Vec::with_capacity(len * half),
                Vec::with_capacity(len * half),
            );
            for pos in 0..len {
                for i in 0..half {
                    let angle = rotary_angle(theta, c.head_dim, i, pos);
                    cos.push(angle.cos() as f32);
                    sin.push(angle.sin() as f32);
                }
            }
            Ok((self.stream.clone_htod(&cos)?, self.stream.clone_htod(&sin)?))
        };
        s.graphs.clear();
        s.rope = Some(table(c.rope_theta)?);
        s.local_rope = c.plan.local_rope_theta.map(table).transpose()?;
        s.rope_len = len;
        Ok(())
    }
}
