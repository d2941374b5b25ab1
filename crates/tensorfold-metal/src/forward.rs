//! The model on a candle device and its one-row forward.

use crate::Result;
use candle_core::{Device, Tensor, D};
use tensorfold_models::{Forward, ForwardError, Logits, Model, ModelConfig, RopeStyle, Seq};
use tensorfold_quant::Matrix;

struct DevBlock {
    attn_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    q_bias: Option<Tensor>,
    k_bias: Option<Tensor>,
    v_bias: Option<Tensor>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    ffn_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// A decoder whose weights (f32) live on a candle device.
pub struct MetalModel {
    device: Device,
    config: ModelConfig,
    embed: Tensor,
    head: Option<Tensor>,
    norm: Tensor,
    blocks: Vec<DevBlock>,
}

/// One sequence's keys and values on the device: per layer `[len, kv_width]`.
/// Truncation narrows the tensors, so a rolled-back cache holds exactly the
/// kept positions' bits.
pub struct MetalKv {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    bytes_per_position: usize,
}

impl MetalKv {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for layer in &mut self.layers {
            *layer = match layer.take() {
                Some((k, v)) if len > 0 => Some((
                    k.narrow(0, 0, len).expect("within the cache"),
                    v.narrow(0, 0, len).expect("within the cache"),
                )),
                _ => None,
            };
        }
        self.len = len;
    }

    /// A cache holding this one's first `len` positions.
    pub fn clone_prefix(&self, len: usize) -> MetalKv {
        let mut c = MetalKv {
            layers: self.layers.clone(),
            len: self.len,
            bytes_per_position: self.bytes_per_position,
        };
        c.truncate(len);
        c
    }

    /// Bytes held by stored positions (keys and values, all layers).
    pub fn bytes(&self) -> usize {
        self.len * self.bytes_per_position
    }

    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let next = match self.layers[layer].take() {
            Some((ks, vs)) => (Tensor::cat(&[&ks, k], 0)?, Tensor::cat(&[&vs, v], 0)?),
            None => (k.clone(), v.clone()),
        };
        self.layers[layer] = Some(next);
        Ok(())
    }
}

impl tensorfold_kv::Cache for MetalKv {
    fn len(&self) -> usize {
        self.len
    }
    fn truncate(&mut self, len: usize) {
        MetalKv::truncate(self, len)
    }
    fn allocated_bytes(&self) -> usize {
        self.bytes()
    }
}

fn dense(m: &Matrix, device: &Device) -> Result<Tensor> {
    let (rows, cols) = (m.rows(), m.cols());
    let mut data = vec![0f32; rows * cols];
    for (r, row) in data.chunks_exact_mut(cols).enumerate() {
        m.row_f32(r, row);
    }
    Ok(Tensor::from_vec(data, (rows, cols), device)?)
}

fn vector(v: &[f32], device: &Device) -> Result<Tensor> {
    Ok(Tensor::from_slice(v, (1, v.len()), device)?)
}

fn opt_vector(v: &Option<Vec<f32>>, device: &Device) -> Result<Option<Tensor>> {
    v.as_deref().map(|v| vector(v, device)).transpose()
}

/// RMSNorm over the last dimension of `x` (`[n, width]`), scaled by `w` (`[1, width]`).
fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps as f64)?.sqrt()?)?
        .broadcast_mul(w)
}

/// `x` (`[1, in]`) times the transpose of `w` (`[out, in]`).
fn linear(x: &Tensor, w: &Tensor, bias: &Option<Tensor>) -> candle_core::Result<Tensor> {
    let y = x.matmul(&w.t()?)?;
    match bias {
        Some(b) => y + b,
        None => Ok(y),
    }
}

impl MetalModel {
    /// Copies `model`'s weights (as f32) to the Metal device.
    pub fn upload(model: &Model) -> Result<MetalModel> {
        #[cfg(target_os = "macos")]
        {
            MetalModel::upload_to(model, Device::new_metal(0)?)
        }
        #[cfg(not(target_os = "macos"))]
        {
            let _ = model;
            Err(crate::MetalError::NoDevice)
        }
    }

    /// Copies `model`'s weights (as f32) to `device`.
    pub fn upload_to(model: &Model, device: Device) -> Result<MetalModel> {
        let missing = model.config.plan.features();
        if !missing.is_empty() {
            return Err(crate::MetalError::Unsupported(format!(
                "{} ({})",
                missing.join(", "),
                model.config.arch.name()
            )));
        }
        let d = &device;
        let blocks = model
            .blocks
            .iter()
            .map(|b| {
                Ok(DevBlock {
                    attn_norm: vector(&b.attn_norm, d)?,
                    q: dense(&b.q, d)?,
                    k: dense(&b.k, d)?,
                    v: dense(&b.v, d)?,
                    o: dense(&b.o, d)?,
                    q_bias: opt_vector(&b.q_bias, d)?,
                    k_bias: opt_vector(&b.k_bias, d)?,
                    v_bias: opt_vector(&b.v_bias, d)?,
                    q_norm: opt_vector(&b.q_norm, d)?,
                    k_norm: opt_vector(&b.k_norm, d)?,
                    ffn_norm: vector(&b.ffn_norm, d)?,
                    gate: dense(&b.gate, d)?,
                    up: dense(&b.up, d)?,
                    down: dense(&b.down, d)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MetalModel {
            embed: dense(&model.embed, d)?,
            head: model.lm_head.as_ref().map(|m| dense(m, d)).transpose()?,
            norm: vector(&model.norm, d)?,
            config: model.config.clone(),
            blocks,
            device,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// An empty cache for one sequence.
    pub fn new_cache(&self) -> MetalKv {
        MetalKv {
            layers: vec![None; self.config.layers],
            len: 0,
            bytes_per_position: self.config.kv_shape().bytes_per_position(),
        }
    }

    /// Runs `tokens` at positions `cache.len()..` and returns the requested
    /// logits row after row.
    pub fn forward(&self, tokens: &[u32], cache: &mut MetalKv, want: Logits) -> Result<Vec<f32>> {
        let mut seqs = [Seq {
            tokens,
            cache,
            logits: want,
        }];
        Ok(self.forward_batch(&mut seqs)?.pop().unwrap_or_default())
    }

    /// Every sequence's requested logits rows; each row runs alone, in
    /// position order, so it is bitwise the row serial decode computes.
    pub fn forward_batch(&self, seqs: &mut [Seq<'_, MetalKv>]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(seqs.len());
        for s in seqs.iter_mut() {
            let wanted = s.logits.rows(s.tokens.len());
            let mut logits = Vec::new();
            for (i, &t) in s.tokens.iter().enumerate() {
                let x = self.row(t, s.cache)?;
                if wanted.contains(&i) {
                    let x = rms_norm(&x, &self.norm, self.config.rms_eps)?;
                    let head = self.head.as_ref().unwrap_or(&self.embed);
                    logits.extend(linear(&x, head, &None)?.flatten_all()?.to_vec1::<f32>()?);
                }
            }
            out.push(logits);
        }
        Ok(out)
    }

    /// The final hidden state of token `t` at position `cache.len()`,
    /// appending its keys and values.
    fn row(&self, t: u32, cache: &mut MetalKv) -> Result<Tensor> {
        let c = &self.config;
        let pos = cache.len;
        let (cos, sin) = self.rotation(pos)?;
        let mut x = self.embed.narrow(0, t as usize, 1)?;
        for (l, b) in self.blocks.iter().enumerate() {
            let xn = rms_norm(&x, &b.attn_norm, c.rms_eps)?;
            let mut q = linear(&xn, &b.q, &b.q_bias)?.reshape((c.heads, c.head_dim))?;
            let mut k = linear(&xn, &b.k, &b.k_bias)?.reshape((c.kv_heads, c.head_dim))?;
            let v = linear(&xn, &b.v, &b.v_bias)?;
            if let Some(w) = &b.q_norm {
                q = rms_norm(&q, w, c.rms_eps)?;
            }
            if let Some(w) = &b.k_norm {
                k = rms_norm(&k, w, c.rms_eps)?;
            }
            let q = self.rotate(&q, &cos, &sin)?;
            let k = self.rotate(&k, &cos, &sin)?.reshape((1, c.kv_width()))?;
            cache.append(l, &k, &v)?;
            let (keys, values) = cache.layers[l].as_ref().expect("appended above");
            let attn = self.attention(&q, keys, values)?;
            x = (x + linear(&attn, &b.o, &None)?)?;
            let xn = rms_norm(&x, &b.ffn_norm, c.rms_eps)?;
            let gate = linear(&xn, &b.gate, &None)?.silu()?;
            let up = linear(&xn, &b.up, &None)?;
            x = (x + linear(&(gate * up)?, &b.down, &None)?)?;
        }
        cache.len += 1;
        Ok(x)
    }

    /// Rotation angles of `pos`, computed in f64 from the position alone.
    fn rotation(&self, pos: usize) -> Result<(Tensor, Tensor)> {
        let c = &self.config;
        let half = c.head_dim / 2;
        let angles: Vec<f64> = (0..half)
            .map(|i| tensorfold_models::rotary_angle(c.rope_theta, c.head_dim, i, pos))
            .collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
        Ok((
            Tensor::from_vec(cos, half, &self.device)?,
            Tensor::from_vec(sin, half, &self.device)?,
        ))
    }

    /// Rotates every head of `x` (`[heads, head_dim]`).
    fn rotate(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        let (heads, hd) = x.dims2()?;
        let half = hd / 2;
        // Pairs (2i, 2i+1) or (i, i+half), as `[heads, half, 2]` or `[heads, 2, half]`.
        let (pairs, axis, angle_shape) = match self.config.rope_style {
            RopeStyle::Interleaved => (x.reshape((heads, half, 2))?, 2, (1, half, 1)),
            RopeStyle::Half => (x.reshape((heads, 2, half))?, 1, (1, 1, half)),
        };
        let (cos, sin) = (cos.reshape(angle_shape)?, sin.reshape(angle_shape)?);
        let x0 = pairs.narrow(axis, 0, 1)?;
        let x1 = pairs.narrow(axis, 1, 1)?;
        let r0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
        let r1 = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
        Tensor::cat(&[&r0, &r1], axis)?.reshape((heads, hd))
    }

    /// One query row (`[heads, head_dim]`) over keys `0..=pos` of its own
    /// sequence; returns `[1, heads * head_dim]`.
    fn attention(&self, q: &Tensor, keys: &Tensor, values: &Tensor) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let (n, group) = (keys.dim(0)?, c.heads / c.kv_heads);
        let per_head = |t: &Tensor| {
            t.reshape((n, c.kv_heads, c.head_dim))?
                .transpose(0, 1)?
                .contiguous()
        };
        let (k, v) = (per_head(keys)?, per_head(values)?);
        let q = q.reshape((c.kv_heads, group, c.head_dim))?;
        let scores = (q.matmul(&k.t()?)? / (c.head_dim as f64).sqrt())?;
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        p.matmul(&v)?.reshape((1, c.q_width()))
    }
}

impl Forward for MetalModel {
    type Cache = MetalKv;
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn forward_batch(
        &self,
        seqs: &mut [Seq<'_, MetalKv>],
    ) -> std::result::Result<Vec<Vec<f32>>, ForwardError> {
        MetalModel::forward_batch(self, seqs).map_err(|e| ForwardError(e.to_string()))
    }
}
