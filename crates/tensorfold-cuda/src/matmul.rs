//! Launch geometry of the matmuls (`kernels/cuda/matmul.cu` and
//! `tensor.cu`): formats, register tiles, the few-row and many-row
//! tensor-core kernels and their shared memory. None of it changes a row's
//! bits: every kernel computes each output in the order the weight shape
//! fixes.

use crate::{CudaError, Result};
use tensorfold_quant::{Encoding, Format};

/// Kernel names of each format, in the order of the codes in
/// `kernels/cuda/common.cuh`.
pub(crate) const FORMATS: [(Format, &str); 9] = [
    (Format::F32, "f32"),
    (Format::F16, "f16"),
    (Format::Bf16, "bf16"),
    (Format::Q4_0, "q4_0"),
    (Format::Q4_1, "q4_1"),
    (Format::Q5_0, "q5_0"),
    (Format::Q8_0, "q8_0"),
    (Format::Q4K, "q4k"),
    (Format::Q6K, "q6k"),
];

/// A register tile of the matmul: rows and columns per warp, and whether
/// the block stages its input rows in shared memory (for many rows). Tiles
/// only group accumulators; every tile computes each element in the same
/// order, so the choice is free to follow the call's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tile {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) staged: bool,
}

pub(crate) const fn tile(rows: usize, cols: usize, staged: bool) -> Tile {
    Tile { rows, cols, staged }
}

/// Every tile `kernels/cuda/matmul.cu` instantiates.
pub(crate) const TILES: [Tile; 9] = [
    tile(1, 1, false),
    tile(2, 2, false),
    tile(4, 2, false),
    tile(8, 4, false),
    tile(1, 4, false),
    tile(2, 4, false),
    tile(16, 4, true),
    tile(8, 8, true),
    tile(16, 8, true),
];
pub(crate) const MM_WARPS: usize = 4;
/// Floats one staged unit of 32 inputs takes in shared memory (`TF_STAGE_STRIDE`).
pub(crate) const STAGE_STRIDE: usize = 36;
/// Rows from which a call uses the staged kernels.
pub(crate) const STAGED_FROM: usize = 32;
/// The staged tile used unless `TENSORFOLD_CUDA_TILE` names another.
pub(crate) const STAGED_DEFAULT: usize = 8;

impl Tile {
    pub(crate) fn kernel(&self, format: &str) -> String {
        let kind = if self.staged { 's' } else { 'r' };
        format!("mm_{format}_{kind}{}_c{}", self.rows, self.cols)
    }

    /// Dynamic shared memory of one block.
    pub(crate) fn shared_bytes(&self) -> usize {
        if self.staged {
            self.rows * 32 * STAGE_STRIDE * 4
        } else {
            0
        }
    }
}

/// Which kernels multiply the GGUF quantized formats. Float formats always
/// take the f32 multiply-add kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernels {
    /// Tensor cores (`kernels/cuda/tensor.cu`): integer weights exact in
    /// f16, inputs rounded to f16, products summed in f32, scales applied
    /// per unit. The default.
    TensorCores,
    /// f32 multiply-adds on the CUDA cores (`kernels/cuda/matmul.cu`):
    /// inputs kept in f32, slower for many rows.
    Fma,
}

impl MatmulKernels {
    /// `TENSORFOLD_CUDA_MATMUL=fma` picks [`MatmulKernels::Fma`]; anything
    /// else (or nothing) the tensor cores.
    pub fn from_env() -> MatmulKernels {
        match std::env::var("TENSORFOLD_CUDA_MATMUL").as_deref() {
            Ok("fma") => MatmulKernels::Fma,
            _ => MatmulKernels::TensorCores,
        }
    }
}

/// Tensor-core tiles for many rows: (16-row weight tiles, 8-row input
/// tiles) per warp, as `tc_<format>_m<C>x<N>` names them, largest first.
pub(crate) const MANY_TILES: [(usize, usize); 3] = [(2, 4), (1, 4), (2, 2)];
pub(crate) const MANY_WARPS: usize = 4;
/// Rows from which a call takes the tensor-core kernel for many rows.
/// Below it the few-row kernel runs, over several block rows past 32: a
/// call of 40 to 160 rows (a round of streams with their drafts) has too
/// few of the many-row kernel's blocks to fill the GPU, and the few-row
/// kernel, which spreads each weight block's segments over warps, ran it
/// 1.1-1.5x sooner on an 8B shape (`examples/bench.rs rows`).
pub(crate) const MANY_FROM: usize = 161;

/// `TENSORFOLD_CUDA_MANY_FROM=n` moves where calls switch to the many-row
/// kernel, for tuning; else [`MANY_FROM`]. Bits do not change with it.
pub(crate) fn many_from_env() -> usize {
    std::env::var("TENSORFOLD_CUDA_MANY_FROM")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(MANY_FROM)
}
/// Input tiles (8 rows each) a few-row block may take: `tc_*_few`,
/// `tc_*_few2`, `tc_*_few4`.
pub(crate) const FEW_TILES: [usize; 3] = [1, 2, 4];

/// The few-row kernel for `tiles` input tiles, after `tc_<format>_`.
pub(crate) fn few_kernel(tiles: usize) -> String {
    match tiles {
        1 => "few".to_string(),
        n => format!("few{n}"),
    }
}
/// Inputs one segment of a tensor-core reduction covers (`TF_SEG` units).
pub(crate) const SEGMENT: usize = 256;
/// Warps of a few-row block at most.
pub(crate) const FEW_WARPS: usize = 8;
/// Shared memory the few-row kernel may use.
pub(crate) const FEW_SHARED_MAX: usize = 200 << 10;
/// Zero bytes after every weight buffer: the tensor-core kernels copy
/// whole aligned 16-byte words, up to 15 bytes past a row's last block.
pub(crate) const WEIGHT_PAD: usize = 32;

/// Weight buffers of a few-row warp (`TF_FEW_STAGES`): one decoded while
/// the others are in flight.
pub(crate) const FEW_STAGES: usize = 2;

/// Dynamic shared memory of a few-row block: every segment's partial
/// sums (512 bytes an input tile), then each warp's `FEW_STAGES` copies
/// of 16 rows of one segment (`tf_seg_words` 16-byte words a row).
pub(crate) fn few_shared(format: Format, segments: usize, warps: usize, tiles: usize) -> usize {
    segments * tiles * 512 + warps * FEW_STAGES * 16 * segment_words(format) * 16
}

/// Dynamic shared memory of a many-row block with `c` 16-row weight tiles
/// and `n` 8-row input tiles per warp: two copies (one in use, one in
/// flight) of the block's input rows of one segment (512 bytes a row), then
/// each warp's two copies of its weight rows of one segment.
pub(crate) fn many_shared(format: Format, c: usize, n: usize) -> usize {
    2 * 8 * n * 512 + MANY_WARPS * 2 * 16 * c * segment_words(format) * 16
}

/// 16-byte words that hold a row's segment wherever it starts
/// (`tf_seg_words`).
pub(crate) fn segment_words(format: Format) -> usize {
    format.matrix_bytes(1, SEGMENT).div_ceil(16) + 1
}

/// Which matmul kernel a launch took, for the profile.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// With this many input tiles.
    Few(usize),
    /// With this index in `MANY_TILES`.
    Many(usize),
    Tile(usize),
    Any,
}

pub(crate) fn fmt_code(e: Encoding) -> Result<usize> {
    let Encoding::Plain(f) = e else {
        return Err(CudaError::Unsupported(format!("{e} weights")));
    };
    FORMATS
        .iter()
        .position(|(g, _)| *g == f)
        .ok_or_else(|| CudaError::Unsupported(format!("{f} weights")))
}

/// Picks the register tile for `m` rows of a matrix with `n` outputs
/// (speed only: see `TILES`). Few rows are bound by loads of the input, so
/// wide matrices share each input load over four columns; narrow ones keep
/// one column per warp to fill the GPU.
pub(crate) fn tile_for(m: usize, n: usize, staged: usize) -> usize {
    let wide = n >= 2048;
    match m {
        1 if wide => 4,
        1 => 0,
        2 if wide => 5,
        2 => 1,
        3..=4 => 2,
        m if m >= STAGED_FROM => staged,
        _ => 3,
    }
}

/// The staged tile for many rows: `TENSORFOLD_CUDA_TILE=s16c8` (16 rows, 8
/// columns per warp) picks another for tuning; bits do not change with it.
pub(crate) fn staged_tile() -> usize {
    let wanted = std::env::var("TENSORFOLD_CUDA_TILE").ok();
    wanted
        .and_then(|w| {
            TILES
                .iter()
                .position(|t| t.staged && format!("s{}c{}", t.rows, t.cols) == w)
        })
        .unwrap_or(STAGED_DEFAULT)
}

/// The tensor-core tile for many rows that `TENSORFOLD_CUDA_TILE=m1x4` (or
/// another of `MANY_TILES`) forces, for tuning; else none, and each call
/// takes the tile that fills the GPU ([`pick_many_tile`]). Bits do not
/// change with it.
pub(crate) fn forced_many_tile() -> Option<usize> {
    many_tile_named(&std::env::var("TENSORFOLD_CUDA_TILE").ok()?)
}

/// The name of many-row tile `i` (an index in `MANY_TILES`): `m<C>x<N>`,
/// as its kernels `tc_<format>_m<C>x<N>` end.
pub(crate) fn many_tile_name(i: usize) -> String {
    let (c, n) = MANY_TILES[i];
    format!("m{c}x{n}")
}

/// The index in `MANY_TILES` of the tile `name` names.
pub(crate) fn many_tile_named(name: &str) -> Option<usize> {
    (0..MANY_TILES.len()).find(|&i| many_tile_name(i) == name)
}

/// Blocks of a many-row launch with tile `(c, n)` for `m` input rows and
/// `rows` weight rows.
pub(crate) fn many_blocks((c, n): (usize, usize), m: usize, rows: usize) -> (usize, usize) {
    (rows.div_ceil(MANY_WARPS * 16 * c), m.div_ceil(8 * n))
}

/// The many-row tile for `m` input rows of a matrix of `rows` weight rows,
/// given how many blocks of each tile the device holds at once
/// (`resident`, by `MANY_TILES`). The largest tile reads each weight and
/// input byte the fewest times, but a 256-row prefill chunk of a
/// 4096-row matrix gives it fewer blocks than the device holds; then a
/// smaller tile whose blocks fill it runs sooner. So: the first tile
/// (largest first) whose launch fills every resident slot at least once,
/// else the one that fills the most of them (the larger on a tie). Speed
/// only: every tile has the same bits.
pub(crate) fn pick_many_tile(m: usize, rows: usize, resident: &[usize]) -> usize {
    let fill = |i: usize| {
        let (x, y) = many_blocks(MANY_TILES[i], m, rows);
        (x * y) as f64 / resident[i].max(1) as f64
    };
    (0..MANY_TILES.len())
        .find(|&i| fill(i) >= 1.0)
        .unwrap_or_else(|| {
            (0..MANY_TILES.len())
                .max_by(|&a, &b| fill(a).total_cmp(&fill(b)).then(b.cmp(&a)))
                .unwrap_or(0)
        })
}

/// How many blocks a few-row tensor-core matmul launches. A block may
/// walk several 16-row weight blocks, its copies running ahead across
/// them; the bits never change with the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FewRowGrid {
    /// A block per weight block (the default).
    PerWeightBlock,
    /// `n` waves of the blocks the device holds at once.
    Waves(usize),
    /// At most `n` blocks.
    Blocks(usize),
}

impl FewRowGrid {
    /// `TENSORFOLD_CUDA_FEW_WAVES=n` picks [`FewRowGrid::Waves`], for
    /// tuning; anything else (or nothing) [`FewRowGrid::PerWeightBlock`].
    pub fn from_env() -> FewRowGrid {
        std::env::var("TENSORFOLD_CUDA_FEW_WAVES")
            .ok()
            .and_then(|w| w.parse().ok())
            .filter(|&w| w > 0)
            .map_or(FewRowGrid::PerWeightBlock, FewRowGrid::Waves)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100's 132 multiprocessors holding 3, 4 and 4 blocks of the tiles.
    const RESIDENT: [usize; 3] = [396, 528, 528];

    #[test]
    fn wide_matrices_keep_the_largest_tile() {
        // An 8B model's gate and up rows, a 256-row chunk: 1,792 blocks.
        assert_eq!(pick_many_tile(256, 28672, &RESIDENT), 0);
        assert_eq!(pick_many_tile(512, 4096, &RESIDENT), 0);
    }

    #[test]
    fn narrow_matrices_take_a_tile_that_fills_the_device() {
        // 4096 rows by 256: 256 blocks of the largest tile, 512 of the next.
        assert_eq!(pick_many_tile(256, 4096, &RESIDENT), 1);
        // Nothing fills it: the most blocks for the slots, the larger on a tie.
        assert_eq!(pick_many_tile(64, 1024, &RESIDENT), 1);
    }
}
