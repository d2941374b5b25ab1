//! One launch each: the matmuls, attention (and the fold of its split
//! form), norms, the gated activation and the residual add, with the
//! launch geometry each kernel expects.

use super::{CudaModel, DevMatrix, Linear, Out, Plan};
use crate::attention;
use crate::attention_f32::{
    attention_shared, attention_tile, split_attention, split_shared, ATTENTION_ROWS, NARROW_HEADS,
    SPLIT_WARPS, STAGE_KEYS_FROM,
};
use crate::kernels::TcAttention;
use crate::launch::{ptr, Launch};
use crate::matmul::{
    few_kernel, few_shared, many_blocks, many_shared, many_tile_name, pick_many_tile, tile_for,
    FewRowGrid, Kind, FEW_SHARED_MAX, FEW_TILES, FEW_WARPS, FORMATS, MANY_TILES, MANY_WARPS,
    MM_WARPS, SEGMENT, TILES,
};
use crate::{CudaError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};
use tensorfold_models::Activation;

impl CudaModel {
    /// `x` is the input in f32 and `x16` the same as the tensor-core
    /// kernels take it (`tf_store_h16`; 0 where the width is not a multiple
    /// of 32, which those kernels never multiply).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul(
        &self,
        w: &DevMatrix,
        x: u64,
        x16: u64,
        y: u64,
        m: usize,
        ldy: usize,
        out: Out,
    ) -> Result<()> {
        let (f, cfg, kind) = if let Some(tc) = &self.k.tensor[w.code] {
            let segments = w.cols.div_ceil(SEGMENT);
            if m < self.k.many_from {
                let warps = segments.min(FEW_WARPS);
                let format = FORMATS[w.code].0;
                // The fewest tiles that hold every row, among those whose
                // partial sums fit (one always does, checked at upload);
                // else the most that fit, over several block rows.
                let fits = |t: &usize| {
                    few_shared(format, segments, warps, FEW_TILES[*t]) <= FEW_SHARED_MAX
                };
                let t = (0..FEW_TILES.len())
                    .filter(fits)
                    .find(|&t| FEW_TILES[t] * 8 >= m)
                    .or_else(|| (0..FEW_TILES.len()).rev().find(fits))
                    .unwrap_or(0);
                let tiles = FEW_TILES[t];
                let shared = few_shared(format, segments, warps, tiles);
                let mut blocks = w.rows.div_ceil(16);
                let most = match self.k.few_grid {
                    FewRowGrid::PerWeightBlock => blocks,
                    FewRowGrid::Waves(waves) => {
                        let resident = tc.few[t].occupancy_max_active_blocks_per_multiprocessor(
                            32 * warps as u32,
                            shared,
                            None,
                        )? as usize;
                        waves * resident * self.k.multiprocessors
                    }
                    FewRowGrid::Blocks(n) => n,
                };
                // As many weight blocks for every block as balances them.
                blocks = blocks.div_ceil(blocks.div_ceil(most.max(1)));
                let cfg = LaunchConfig {
                    grid_dim: (blocks as u32, m.div_ceil(8 * tiles) as u32, 1),
                    block_dim: (32 * warps as u32, 1, 1),
                    shared_mem_bytes: shared as u32,
                };
                (&tc.few[t], cfg, Kind::Few(tiles))
            } else {
                let tile = self
                    .k
                    .forced_many
                    .unwrap_or_else(|| pick_many_tile(m, w.rows, &tc.resident));
                let (c, n) = MANY_TILES[tile];
                let (x, y) = many_blocks((c, n), m, w.rows);
                let cfg = LaunchConfig {
                    grid_dim: (x as u32, y as u32, 1),
                    block_dim: ((MANY_WARPS * 32) as u32, 1, 1),
                    shared_mem_bytes: many_shared(FORMATS[w.code].0, c, n) as u32,
                };
                (&tc.many[tile], cfg, Kind::Many(tile))
            }
        } else if w.cols.is_multiple_of(32) {
            let t = tile_for(m, w.rows, self.k.staged);
            let tile = TILES[t];
            let cfg = LaunchConfig {
                grid_dim: (
                    w.rows.div_ceil(MM_WARPS * tile.cols) as u32,
                    m.div_ceil(tile.rows) as u32,
                    1,
                ),
                block_dim: ((MM_WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: tile.shared_bytes() as u32,
            };
            (&self.k.matmul[w.code][t], cfg, Kind::Tile(t))
        } else {
            // Only f32 rows come this narrow (`on_device`).
            let cfg = LaunchConfig {
                grid_dim: (w.rows.div_ceil(MM_WARPS) as u32, m as u32, 1),
                block_dim: ((MM_WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            (&self.k.matmul_any, cfg, Kind::Any)
        };
        let wp = ptr(&w.data, &self.stream);
        let (mi, n, k, ld, mode) = (
            m as i32,
            w.rows as i32,
            w.cols as i32,
            ldy as i32,
            out.mode(),
        );
        let tensor = matches!(kind, Kind::Few(_) | Kind::Many(_));
        debug_assert!(
            !tensor || x16 != 0,
            "tensor-core input without its f16 copy"
        );
        if !tensor && matches!(out, Out::Gated(_)) {
            return Err(CudaError::Invalid(
                "a gated product needs the tensor-core kernels".into(),
            ));
        }
        let input = if tensor { x16 } else { x };
        let y16 = out.y16();
        let mut b = Launch::new(f);
        b.arg(&wp).arg(&input).arg(&y);
        if tensor {
            b.arg(&y16);
        }
        b.arg(&mi).arg(&n).arg(&k).arg(&ld).arg(&mode);
        // SAFETY: the arguments match `mm_*` in matmul.cu and `tc_*` in
        // tensor.cu (the few-row kernel's shared memory holds every
        // segment's partial sums of its tiles, checked above, with one tile
        // always fitting, checked at upload); `w` holds
        // `rows` rows of `cols` inputs, `x` holds `m * cols` floats (`x16`,
        // for the tensor cores, `m * cols / 2` words) and `y` at least
        // `m * ldy` with `ldy >= rows` (gated: `ldy >= rows / 2`, the
        // rows interleaved as `GateUp::Gated` says, and `y16`, unless 0,
        // `m * ldy / 2` words), all on this stream.
        unsafe { b.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| {
            let kernel = match kind {
                Kind::Few(tiles) => format!("tensor {}", few_kernel(tiles)),
                Kind::Many(tile) => format!("tensor {}", many_tile_name(tile)),
                Kind::Tile(t) => TILES[t].kernel("fma"),
                Kind::Any => "fma any".to_string(),
            };
            let format = FORMATS[w.code].1;
            let gated = if matches!(out, Out::Gated(_)) {
                " + silu"
            } else {
                ""
            };
            format!("matmul {format} {kernel} {}x{}{gated}", w.rows, w.cols)
        })
    }

    /// Attention of every row of `p` over its sequence's keys of `layer`,
    /// from `p.q` into `p.attn` (and `p.attn16`): on the tensor cores for
    /// the head dimensions they serve, else in f32.
    pub(super) fn attention(&self, p: &Plan, layer: i32) -> Result<()> {
        let c = &self.config;
        let m = p.m;
        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let plan = &c.plan;
        let scale = 1.0 / (plan.query_scale_dim.unwrap_or(c.head_dim) as f32).sqrt();
        // The f32 kernels' window (0: none) and score cap (0: none); the
        // tensor-core ones serve models with neither (`tc_attention`).
        let window = plan
            .sliding_window
            .filter(|w| w.applies_to(layer as usize))
            .map_or(0, |w| w.size as i32);
        let softcap = plan.attn_softcap.unwrap_or(0.0);
        let (q, attn, attn16) = (p.q, p.attn, p.attn16);
        let group = c.heads / c.kv_heads;
        let tc = self.tc_attention();
        let split = split_attention(m, p.seqs);
        let k = &self.k;
        let (kernel, name) = match (tc, split, c.head_dim <= NARROW_HEADS) {
            (Some(f), _, _) if p.attention_splits > 1 => (&f.attend, "attention tc split"),
            (Some(f), _, _) => (&f.attend, "attention tc"),
            (None, true, true) => (&k.attention_split_128, "attention split"),
            (None, true, false) => (&k.attention_split, "attention split"),
            (None, false, true) => (&k.attention_128, "attention"),
            (None, false, false) => (&k.attention, "attention"),
        };
        let (rows, hb) = match tc {
            Some(_) => attention::tile(m, p.seqs, group),
            None => attention_tile(m, group),
        };
        // Staging pays once several rows share the key blocks.
        let stage = (m >= STAGE_KEYS_FROM) as i32;
        let (mi, rows_i, hb_i) = (m as i32, rows as i32, hb as i32);
        // Every attention kernel takes these first.
        let mut lb = Launch::new(kernel);
        lb.arg(&q).arg(&heads).arg(&kv_heads).arg(&hd).arg(&scale);
        p.cache_args(&mut lb);
        lb.arg(&layer).arg(&attn).arg(&attn16);
        let blocks = (m.div_ceil(rows) as u32, (c.heads / hb) as u32, 1);
        let part_blocks = p.partial_blocks as i32;
        // The fused form's null partials.
        let fused = 0u64;
        let cfg = match (tc, split) {
            (Some(_), _) if p.attention_splits > 1 => {
                lb.arg(&mi)
                    .arg(&rows_i)
                    .arg(&hb_i)
                    .arg(&p.partials)
                    .arg(&part_blocks);
                LaunchConfig {
                    grid_dim: (blocks.0, blocks.1, p.attention_splits as u32),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: attention::split_shared(c.head_dim) as u32,
                }
            }
            (Some(_), _) => {
                lb.arg(&mi)
                    .arg(&rows_i)
                    .arg(&hb_i)
                    .arg(&fused)
                    .arg(&part_blocks);
                LaunchConfig {
                    grid_dim: blocks,
                    block_dim: (32 * attention::warps(c.head_dim) as u32, 1, 1),
                    shared_mem_bytes: attention::shared(c.head_dim) as u32,
                }
            }
            (None, true) => {
                lb.arg(&window).arg(&softcap);
                LaunchConfig {
                    grid_dim: (m as u32, c.heads as u32, 1),
                    block_dim: (32 * SPLIT_WARPS as u32, 1, 1),
                    shared_mem_bytes: split_shared(c.head_dim) as u32,
                }
            }
            (None, false) => {
                lb.arg(&mi)
                    .arg(&rows_i)
                    .arg(&hb_i)
                    .arg(&stage)
                    .arg(&window)
                    .arg(&softcap);
                let warps = rows.div_ceil(ATTENTION_ROWS) * hb;
                LaunchConfig {
                    grid_dim: blocks,
                    block_dim: (32 * warps as u32, 1, 1),
                    shared_mem_bytes: attention_shared(c.head_dim, warps) as u32,
                }
            }
        };
        // SAFETY: matches `attention_tc_<hd>` in attention.cu (for this
        // head dimension), `attention` or `attention_split` in ops.cu;
        // keys 0..=pos of each row were written by this or an earlier
        // forward; a tensor-core tile's rows times heads are at most 16 and
        // its heads divide the group (`attention::tile`); `attention` has
        // at most ATTENTION_WARPS warps; the shared memory is what the
        // attributes set at load allow (`attention_split` and a split
        // tensor-core block stay under the default 48 KB); in the split
        // form `partials` holds `partial_blocks` key blocks for each of the
        // call's at most SPLIT_ROWS rows (`forward_batch_picked`).
        unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| name.into())?;
        match tc {
            Some(f) if p.attention_splits > 1 => self.fold_attention(f, p),
            _ => Ok(()),
        }
    }

    /// The tensor-core attention for this model's head dimension, if any
    /// (and if the model's attention has no sliding window and no score
    /// cap, which only the f32 kernels apply).
    pub(super) fn tc_attention(&self) -> Option<&TcAttention> {
        let plan = &self.config.plan;
        if plan.sliding_window.is_some() || plan.attn_softcap.is_some() {
            return None;
        }
        self.k
            .attention_tc
            .iter()
            .find(|f| f.head_dim == self.config.head_dim)
    }

    /// Folds the split attention's partials of every (row, head) in block
    /// order into `p.attn` (and `p.attn16`).
    pub(super) fn fold_attention(&self, f: &TcAttention, p: &Plan) -> Result<()> {
        let c = &self.config;
        let heads = c.heads as i32;
        let part_blocks = p.partial_blocks as i32;
        let mut lb = Launch::new(&f.fold);
        lb.arg(&p.partials)
            .arg(&part_blocks)
            .arg(&heads)
            .arg(&p.pos)
            .arg(&p.attn)
            .arg(&p.attn16);
        // A warp for every 32 output columns of a (row, head).
        let cfg = LaunchConfig {
            grid_dim: (p.m as u32, c.heads as u32, c.head_dim.div_ceil(32) as u32),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `attention_fold_<hd>` in attention.cu for this
        // head dimension; the split attention just wrote, on this stream,
        // the partials of every key block each row reads, within the
        // `partial_blocks` a slot has room for; `attn` has `m * heads *
        // head_dim` floats (`attn16`, unless 0, half as many words).
        unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| "attention fold".into())
    }

    pub(super) fn linear(&self, l: &Linear, x: u64, x16: u64, y: u64, m: usize) -> Result<()> {
        for (w, off) in &l.parts {
            self.matmul(w, x, x16, y + (*off * 4) as u64, m, l.width, Out::Set)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rmsnorm(
        &self,
        x: u64,
        idx: u64,
        w: u64,
        out: u64,
        out16: u64,
        rows: usize,
        h: usize,
    ) -> Result<()> {
        let (hi, eps) = (h as i32, self.config.rms_eps);
        let mut b = Launch::new(&self.k.rmsnorm);
        b.arg(&x)
            .arg(&idx)
            .arg(&w)
            .arg(&out)
            .arg(&out16)
            .arg(&hi)
            .arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `rmsnorm` in ops.cu; `x` has `h` floats per row
        // (and every `idx` entry is a row of it), `out` has `rows * h`,
        // `out16` (unless 0) `rows * h / 2` words with `h` a multiple of 32;
        // `x`, `w` and `out` start allocations, so rows of a multiple of 4
        // are 16-byte aligned for the kernel's float4 path.
        unsafe { b.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| "rmsnorm".into())
    }

    /// `act = f(gate) * up` from `gu` (gate | up, `ff` each, `m` rows),
    /// SiLU or GELU as the plan says, with its f16 copy in `act16` unless 0.
    pub(super) fn gated_mul(
        &self,
        gu: u64,
        act: u64,
        act16: u64,
        m: usize,
        ff: usize,
    ) -> Result<()> {
        let (mi, fi) = (m as i32, ff as i32);
        let gelu = (self.config.plan.activation == Activation::GeluTanh) as i32;
        let mut lb = Launch::new(&self.k.gated_mul);
        lb.arg(&gu)
            .arg(&act)
            .arg(&act16)
            .arg(&mi)
            .arg(&fi)
            .arg(&gelu);
        let cfg = LaunchConfig {
            grid_dim: ((m * ff).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `gated_mul`; `gu` holds `m * 2ff`, `act` `m * ff`,
        // `act16` (unless 0) `m * ff / 2` words with `ff` a multiple of 32.
        unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| "gated_mul".into())
    }

    /// Adds a product to the residual `p.x`: `product(out, mode)` writes it
    /// straight there, or, with a post norm, to `p.proj`, whose norm is
    /// then added.
    pub(super) fn residual_add(
        &self,
        post_norm: &Option<CudaSlice<f32>>,
        p: &Plan,
        m: usize,
        product: impl FnOnce(u64, Out) -> Result<()>,
    ) -> Result<()> {
        let Some(norm) = post_norm else {
            return product(p.x, Out::Add);
        };
        product(p.proj, Out::Set)?;
        let (h, eps) = (self.config.hidden_size as i32, self.config.rms_eps);
        let w = ptr(norm, &self.stream);
        let mut lb = Launch::new(&self.k.rmsnorm_add);
        lb.arg(&p.x).arg(&p.proj).arg(&w).arg(&h).arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (m as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `rmsnorm_add` in ops.cu; `x` and `proj` (sized
        // when the plan has post norms) hold `m` rows of `h`, `w` `h`.
        unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| "rmsnorm_add".into())
    }
}
