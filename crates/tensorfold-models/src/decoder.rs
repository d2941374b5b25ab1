//! The decoder forward shared by every family: embeddings, pre-norm
//! attention and gated-MLP (or mixture-of-experts) blocks, final norm,
//! logits, as the model's [`crate::plan::Plan`] says.
//!
//! Every step is row-local or reduces in a fixed order: matmuls through
//! [`Matrix::matmul`], norms per row, rotary angles from the absolute
//! position, attention for each query over keys `0..=pos` in blocks from
//! position 0 (see `attention`). So the logits of a position do not depend on how many rows share the call or
//! where a prefill chunk starts.

use crate::attention::attention;
use crate::config::{ModelConfig, RopeStyle};
use crate::moe::{gated, mixture, ExpertWeights};
use crate::plan::rotary_angle;
use tensorfold_forward::{Forward, ForwardError, Logits, PickingForward, Seq};
use tensorfold_kv::KvCache;
use tensorfold_quant::{sum_squares, Matrix};
use tensorfold_sampling::{Draw, SeqRows};

/// One transformer block's weights.
pub struct Block {
    pub attn_norm: Vec<f32>,
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub o: Matrix,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    /// The dense MLP (empty matrices in a block of experts).
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    /// The routed experts that replace the dense MLP.
    pub experts: Option<ExpertWeights>,
    /// Norms of the attention output and of the MLP output, before each is
    /// added to the residual (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A loaded decoder.
pub struct Model {
    pub config: ModelConfig,
    pub embed: Matrix,
    pub blocks: Vec<Block>,
    pub norm: Vec<f32>,
    /// `None` when the embeddings are tied.
    pub lm_head: Option<Matrix>,
}

fn rms_norm(x: &mut [f32], width: usize, weight: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(width) {
        let scale = 1.0 / (sum_squares(row) / width as f32 + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * scale * *w;
        }
    }
}

fn add_bias(x: &mut [f32], bias: &Option<Vec<f32>>) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, b)| *v += *b);
        }
    }
}

/// Rotation angles for absolute positions, computed in f64 from the
/// position alone.
struct Rope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    style: RopeStyle,
}

impl Rope {
    fn new(config: &ModelConfig, theta: f64, positions: impl Iterator<Item = usize>) -> Rope {
        let half = config.head_dim / 2;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for pos in positions {
            for i in 0..half {
                let angle = rotary_angle(theta, config.head_dim, i, pos);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Rope {
            cos,
            sin,
            half,
            style: config.rope_style,
        }
    }

    /// Rotates every head of row `r` in place.
    fn apply(&self, r: usize, row: &mut [f32], head_dim: usize) {
        let (cos, sin) = (
            &self.cos[r * self.half..][..self.half],
            &self.sin[r * self.half..][..self.half],
        );
        for head in row.chunks_exact_mut(head_dim) {
            for i in 0..self.half {
                let (a, b) = match self.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Half => (i, i + self.half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

/// The CPU forward: it never fails.
impl Forward for Model {
    type Cache = KvCache;
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn forward_batch(
        &self,
        seqs: &mut [Seq<'_, KvCache>],
    ) -> std::result::Result<Vec<Vec<f32>>, ForwardError> {
        Ok(Model::forward_batch(self, seqs))
    }
}

/// The CPU forward hands every row back: the host picks them.
impl PickingForward for Model {
    fn forward_picked(
        &self,
        seqs: &mut [Seq<'_, KvCache>],
        _draws: &[Option<Draw>],
    ) -> std::result::Result<Vec<SeqRows>, ForwardError> {
        Ok(Forward::forward_batch(self, seqs)?
            .into_iter()
            .map(SeqRows::Logits)
            .collect())
    }
}

impl Model {
    /// Runs `tokens` at positions `cache.len()..`, appending their keys and
    /// values to `cache`, and returns the requested logits row after row.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, want: Logits) -> Vec<f32> {
        let mut seqs = [Seq {
            tokens,
            cache,
            logits: want,
        }];
        self.forward_batch(&mut seqs).pop().unwrap_or_default()
    }

    /// Runs several sequences in one forward: their rows share every matmul,
    /// and each attends only to its own cache. Because every step is
    /// row-local or reduces in a fixed order, each sequence's logits are
    /// bitwise those it would get alone. Returns each sequence's logits.
    pub fn forward_batch(&self, seqs: &mut [Seq<'_, KvCache>]) -> Vec<Vec<f32>> {
        // On a pool thread, each matmul's parallel split starts on the
        // calling thread at once, instead of waking the pool and sleeping
        // until it is done; the other workers stay awake meanwhile.
        crate::busy_pool::with_awake_workers(|| self.forward_rows(seqs))
    }

    /// The forward itself; [`Model::forward_batch`] runs it with the pool
    /// awake.
    fn forward_rows(&self, seqs: &mut [Seq<'_, KvCache>]) -> Vec<Vec<f32>> {
        let c = &self.config;
        let h = c.hidden_size;
        let m: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if m == 0 {
            return vec![Vec::new(); seqs.len()];
        }
        let starts: Vec<usize> = seqs.iter().map(|s| s.cache.len()).collect();
        let positions = || {
            seqs.iter()
                .zip(&starts)
                .flat_map(|(s, &st)| st..st + s.tokens.len())
        };
        let p = &c.plan;
        let rope = Rope::new(c, c.rope_theta, positions());
        let local_rope = p.local_rope_theta.map(|t| Rope::new(c, t, positions()));

        let mut x = vec![0f32; m * h];
        let tokens = seqs.iter().flat_map(|s| s.tokens.iter());
        for (row, &t) in x.chunks_exact_mut(h).zip(tokens) {
            self.embed.row_f32(t as usize, row);
        }
        if p.embed_scale {
            let scale = (h as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= scale);
        }

        // Blocks of experts have no dense MLP to hold rows for.
        let ff = match p.experts {
            Some(_) => 0,
            None => c.intermediate_size,
        };
        let (qw, kvw) = (c.q_width(), c.kv_width());
        let mut xn = vec![0f32; m * h];
        let mut q = vec![0f32; m * qw];
        let mut k = vec![0f32; m * kvw];
        let mut v = vec![0f32; m * kvw];
        let mut attn = vec![0f32; m * qw];
        let mut proj = vec![0f32; m * h];
        let mut gate = vec![0f32; m * ff];
        let mut up = vec![0f32; m * ff];

        for (l, b) in self.blocks.iter().enumerate() {
            xn.copy_from_slice(&x);
            rms_norm(&mut xn, h, &b.attn_norm, c.rms_eps);
            Matrix::matmul_each(&[&b.q, &b.k, &b.v], &xn, m, &mut [&mut q, &mut k, &mut v]);
            add_bias(&mut q, &b.q_bias);
            add_bias(&mut k, &b.k_bias);
            add_bias(&mut v, &b.v_bias);
            if let Some(w) = &b.q_norm {
                rms_norm(&mut q, c.head_dim, w, c.rms_eps);
            }
            if let Some(w) = &b.k_norm {
                rms_norm(&mut k, c.head_dim, w, c.rms_eps);
            }
            let sliding = p.sliding_window.is_some_and(|w| w.applies_to(l));
            let rope = match &local_rope {
                Some(local) if sliding => local,
                _ => &rope,
            };
            for r in 0..m {
                rope.apply(r, &mut q[r * qw..(r + 1) * qw], c.head_dim);
                rope.apply(r, &mut k[r * kvw..(r + 1) * kvw], c.head_dim);
            }
            let mut row = 0;
            for (s, &start) in seqs.iter_mut().zip(&starts) {
                let n = s.tokens.len();
                let (rows_q, rows_kv) = (row * qw..(row + n) * qw, row * kvw..(row + n) * kvw);
                s.cache.append(l, &k[rows_kv.clone()], &v[rows_kv]);
                attention(c, s.cache, l, start, &q[rows_q.clone()], &mut attn[rows_q]);
                row += n;
            }

            b.o.matmul(&attn, m, &mut proj);
            if let Some(w) = &b.post_attn_norm {
                rms_norm(&mut proj, h, w, c.rms_eps);
            }
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += *p);

            xn.copy_from_slice(&x);
            rms_norm(&mut xn, h, &b.ffn_norm, c.rms_eps);
            match (&p.experts, &b.experts) {
                (Some(e), Some(w)) => mixture(e, w, p.activation, &xn, m, &mut proj),
                _ => {
                    Matrix::matmul_each(&[&b.gate, &b.up], &xn, m, &mut [&mut gate, &mut up]);
                    gated(p.activation, &mut gate, &up);
                    b.down.matmul(&gate, m, &mut proj);
                }
            }
            if let Some(w) = &b.post_ffn_norm {
                rms_norm(&mut proj, h, w, c.rms_eps);
            }
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += *p);
        }

        // Only the asked-for rows go through the output head.
        let mut picked = Vec::new();
        let mut counts = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for s in seqs.iter() {
            let want = s.logits.rows(s.tokens.len());
            counts.push(want.len());
            picked.extend_from_slice(&x[(row + want.start) * h..(row + want.end) * h]);
            row += s.tokens.len();
        }
        let n = picked.len() / h;
        let vocab = c.vocab_size;
        let mut logits = vec![0f32; n * vocab];
        if n > 0 {
            rms_norm(&mut picked, h, &self.norm, c.rms_eps);
            let head = self.lm_head.as_ref().unwrap_or(&self.embed);
            head.matmul(&picked, n, &mut logits);
            if let Some(cap) = c.plan.final_softcap {
                logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut rest = logits.as_slice();
        for n in counts {
            let (mine, tail) = rest.split_at(n * vocab);
            out.push(mine.to_vec());
            rest = tail;
        }
        out
    }

    /// Bytes the weights take in memory.
    pub fn weight_bytes(&self) -> usize {
        let vec = |v: &Vec<f32>| v.len() * 4;
        let opt = |v: &Option<Vec<f32>>| v.as_ref().map_or(0, vec);
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
                    + vec(&b.attn_norm)
                    + vec(&b.ffn_norm)
                    + opt(&b.q_bias)
                    + opt(&b.k_bias)
                    + opt(&b.v_bias)
                    + opt(&b.q_norm)
                    + opt(&b.k_norm)
                    + opt(&b.post_attn_norm)
                    + opt(&b.post_ffn_norm)
                    + b.experts.as_ref().map_or(0, ExpertWeights::bytes)
            })
            .sum();
        blocks
            + self.embed.bytes()
            + self.lm_head.as_ref().map_or(0, |m| m.bytes())
            + vec(&self.norm)
    }

    /// Bytes of weights read to decode one token: every block matrix and the
    /// output head, but only one row of the embeddings.
    pub fn bytes_per_token(&self) -> usize {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed).bytes();
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                let used = self.config.plan.experts.map_or(0, |e| e.used);
                [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
                    + b.experts.as_ref().map_or(0, |e| e.bytes_per_token(used))
            })
            .sum();
        blocks + head
    }
}
