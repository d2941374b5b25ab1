//! The integer dot of quantized input rows with unpacked weight rows, in
//! the one order every path computes (see [`reference`]).

use super::activations::QuantizedRows;
use super::lanes::RowSpans;
use super::unpack::{Layout, Packing, UnpackedRows};
use super::wide::{Inputs, Weights};
use super::{BLOCK, HALF};

/// Running float sums of a dot: half block `h` goes into sum `h % SUMS`
/// (see [`reference`]).
const SUMS: usize = 16;
/// Blocks of a span: one half block for each running sum.
const SPAN: usize = SUMS / 2;

/// Input rows one kernel call takes at most (its registers' worth), on
/// every instruction set.
pub(crate) const MAX_ROWS: usize = 2;

/// Input rows the few-row AVX-512 kernel takes at most in a call: its
/// running sums are one register a row, and each weight span it puts in
/// lanes serves them all. Nine: a stream's longest verify window (eight
/// drafts and the row after them) in one call. (One row alone runs the
/// kernel that sums each dot's lanes instead: with one dot a span, putting
/// the span in lanes saves nothing.)
pub(crate) const LANE_ROWS: usize = 9;

/// Input rows from which the wide kernel runs: below, unpacking the tile
/// and the inputs' pair terms costs more than it saves.
#[cfg(target_arch = "x86_64")]
const WIDE_FROM: usize = 32;

/// The instruction sets the kernels come in, picked once from the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// NEON with the dot-product extension (SDOT).
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// Every set this CPU runs, the portable one first.
    #[cfg(test)]
    pub fn available() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if avx2 {
                all.push(Isa::Avx2);
            }
            if avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                all.push(Isa::Avx512Vnni);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            all.push(Isa::Neon);
        }
        all
    }

    /// Whether the kernels decode packed values in registers (see
    /// [`Packing`]); the others read the unpacked copy.
    pub fn reads_packed(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => true,
            _ => false,
        }
    }

    /// Whether a call of `rows` input rows whose kernel reads the GGUF
    /// bytes decodes the weights' scales and minimums there as it goes,
    /// instead of reading the tile's, filled first: as floats they take
    /// 8-12 bytes a 32-block (96 a Q4_K 256-block) against the 18-34
    /// bytes of the block itself, and at one row, with nothing to share
    /// them, writing and reading them back costs more than decoding them
    /// in place.
    pub fn decodes_scales(self, rows: usize) -> bool {
        self.reads_packed() && rows == 1
    }

    /// Whether the kernel for two rows and more reads its inputs in lanes
    /// (see [`super::lanes`]), laid out once a call.
    pub fn reads_in_lanes(self) -> bool {
        self.reads_packed()
    }

    /// Input rows a kernel call takes at most, with the wide kernel or
    /// without.
    pub fn rows_per_call(self, wide: bool) -> usize {
        if self.reads_in_lanes() && !wide {
            LANE_ROWS
        } else {
            MAX_ROWS
        }
    }

    /// Whether a call's kernel takes twice the weight rows (its registers
    /// hold more running sums).
    pub fn wider(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => true,
            _ => false,
        }
    }

    /// From how many input rows a call runs the wide kernel, which reads
    /// per-call input terms and unpacked weights; `None` where there is none.
    pub fn wide_from(self) -> Option<usize> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => Some(WIDE_FROM),
            _ => None,
        }
    }

    /// The fastest this CPU runs (`TENSORFOLD_CPU_KERNELS=portable` forces
    /// the portable one).
    pub fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            if std::env::var("TENSORFOLD_CPU_KERNELS").as_deref() == Ok("portable") {
                return Isa::Portable;
            }
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
                if avx2
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    return Isa::Avx512Vnni;
                }
                if avx2 {
                    return Isa::Avx2;
                }
            }
            #[cfg(target_arch = "aarch64")]
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                return Isa::Neon;
            }
            Isa::Portable
        })
    }
}

/// Where one kernel call reads: input rows `r0..r0 + R` and weight rows
/// `j0..j0 + W` of the tile.
pub(crate) struct Operands<'a> {
    pub inputs: &'a QuantizedRows,
    pub r0: usize,
    pub weights: &'a UnpackedRows,
    /// The weights' 8-bit values: the unpacked ones, or the GGUF bytes.
    pub values: Values<'a>,
    pub j0: usize,
    pub layout: Layout,
    /// The call's inputs and the tile's weights as the wide kernel's
    /// records, where it runs.
    pub wide: Option<(&'a Inputs, &'a Weights)>,
    /// The call's inputs in lanes, for the AVX-512 kernel of two rows and
    /// more.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub lanes: Option<&'a RowSpans>,
    /// The kernel decodes the weights' scales (and minimums) from the GGUF
    /// bytes itself, where [`Isa::decodes_scales`] says so: `weights`
    /// then holds none of this tile's.
    pub own_scales: bool,
}

/// Weight values as `packing` lays them out: block `b` of row `j` starts at
/// `start + j * row_stride + b * block_stride` (for [`Packing::KNibbles`],
/// `block_stride` is a 256-block's).
#[derive(Clone, Copy)]
pub(crate) struct Values<'a> {
    pub data: &'a [i8],
    pub start: usize,
    pub row_stride: usize,
    pub block_stride: usize,
    pub packing: Packing,
    /// Bytes from a value to the same value of the next tile, which the
    /// kernel asks the memory for while it works on this one (0: none).
    pub ahead: usize,
}

impl Values<'_> {
    fn at(&self, j: usize, b: usize) -> usize {
        self.start + j * self.row_stride + b * self.block_stride
    }

    /// The 32 values of block `b` of row `j`: only for [`Packing::Bytes`].
    pub fn block(&self, j: usize, b: usize) -> &[i8] {
        assert_eq!(self.packing, Packing::Bytes, "a packed block has no bytes");
        &self.data[self.at(j, b)..][..BLOCK]
    }

    /// Checks that rows `j0..j0 + rows`, `blocks` long, are in bounds.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn check(&self, j0: usize, rows: usize, blocks: usize) {
        assert!(rows > 0 && blocks > 0);
        let last = j0 + rows - 1;
        let end = match self.packing {
            Packing::Bytes => self.at(last, blocks - 1) + BLOCK,
            Packing::Nibbles { .. } => self.at(last, blocks),
            Packing::KNibbles | Packing::SixBits => {
                assert!(blocks.is_multiple_of(8));
                self.at(last, blocks / 8)
            }
        };
        assert!(end <= self.data.len());
    }
}

impl Operands<'_> {
    fn blocks(&self) -> usize {
        self.inputs.blocks_per_row()
    }

    /// The float part of the weight rows' minimums, `out[r][j]`: one
    /// fixed-order dot ([`crate::dot`]'s) of the weight row's block minimums
    /// with the input row's block sums, added after the integer part.
    fn mins<const R: usize, const W: usize>(&self) -> Option<[[f32; W]; R]> {
        if !self.layout.block_mins || self.own_scales {
            return None;
        }
        let mut out = [[0f32; W]; R];
        if let Some((_, weights)) = self.wide {
            for (r, row) in out.iter_mut().enumerate() {
                row.copy_from_slice(&weights.row_mins[self.r0 + r][self.j0..][..W]);
            }
            return Some(out);
        }
        let blocks = self.blocks();
        let x = &self.inputs.block_sums[self.r0 * blocks..];
        let w = &self.weights.block_mins[self.j0 * blocks..];
        assert!(x.len() >= R * blocks && w.len() >= W * blocks);
        // SAFETY: `R` rows of `x` and `W` of `w`, `blocks` apart and long,
        // asserted above.
        unsafe {
            crate::dot::dot_block::<R, W>(x.as_ptr(), blocks, w.as_ptr(), blocks, blocks, &mut out)
        };
        Some(out)
    }
}

/// The sixteen running sums of a dot as one float: sums `l` and `l + 8`
/// first, then the eight as [`crate::dot`] combines its lanes.
fn combine(v: &[f32; SUMS]) -> f32 {
    let e: [f32; 8] = std::array::from_fn(|l| v[l] + v[l + 8]);
    ((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7]))
}

/// The order, written for clarity: the definition the fast paths match.
///
/// For input row `r` and weight row `j`, half block by half block: the
/// exact integer sum of the half block's 16 products is converted to float
/// and fused-multiply-added, with factor `weight half-block scale * input
/// block scale` (one rounding), into running sum `h % 16` of half block
/// `h`. The sixteen sums are combined by [`combine`], and a format's
/// minimums added last as one [`crate::dot`] of its block minimums with
/// the input's block sums.
pub(crate) fn reference(ops: &Operands, r: usize, j: usize) -> f32 {
    let (blocks, cols) = (ops.blocks(), ops.inputs.cols);
    let x = &ops.inputs.values[(ops.r0 + r) * cols..][..cols];
    let x_scales = &ops.inputs.scales[(ops.r0 + r) * blocks..][..blocks];
    let half_scales = &ops.weights.half_scales[(ops.j0 + j) * 2 * blocks..][..2 * blocks];
    let mut sums = [0f32; SUMS];
    for h in 0..2 * blocks {
        let w = &ops.values.block(ops.j0 + j, h / 2)[(h % 2) * HALF..][..HALF];
        let x = &x[h * HALF..][..HALF];
        let product: i32 = x.iter().zip(w).map(|(&a, &b)| a as i32 * b as i32).sum();
        let factor = half_scales[h] * x_scales[h / 2];
        sums[h % SUMS] = factor.mul_add(product as f32, sums[h % SUMS]);
    }
    let main = combine(&sums);
    if ops.layout.block_mins {
        let (x, w) = (
            &ops.inputs.block_sums[(ops.r0 + r) * blocks..][..blocks],
            &ops.weights.block_mins[(ops.j0 + j) * blocks..][..blocks],
        );
        main + crate::dot_portable(x, w)
    } else {
        main
    }
}

/// `out[r][j]` for `R` input rows and `W` weight rows at once.
pub(crate) fn dots<const R: usize, const W: usize>(
    isa: Isa,
    ops: &Operands,
    out: &mut [[f32; W]; R],
) {
    *out = match isa {
        Isa::Portable => std::array::from_fn(|r| std::array::from_fn(|j| reference(ops, r, j))),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only detected where AVX2 and FMA run.
        Isa::Avx2 => unsafe { avx2::main::<R, W>(ops) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `Isa::Neon` is only detected where the dot product runs.
        Isa::Neon => unsafe { neon::main::<R, W>(ops) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512Vnni` only where AVX-512 F/BW/VL/VNNI run.
        Isa::Avx512Vnni => unsafe {
            // `$kernel` for the values' packing.
            macro_rules! by_packing {
                ($kernel:ident) => {
                    match ops.values.packing {
                        Packing::Bytes => avx512::$kernel::<R, W, { avx512::BYTES }>(ops),
                        Packing::Nibbles { fifth: None, .. } => {
                            avx512::$kernel::<R, W, { avx512::NIBBLES }>(ops)
                        }
                        Packing::Nibbles { fifth: Some(_), .. } => {
                            avx512::$kernel::<R, W, { avx512::FIFTH_BITS }>(ops)
                        }
                        Packing::KNibbles => avx512::$kernel::<R, W, { avx512::K_NIBBLES }>(ops),
                        Packing::SixBits => avx512::$kernel::<R, W, { avx512::SIX_BITS }>(ops),
                    }
                };
            }
            match (ops.wide, ops.lanes) {
                (Some((inputs, weights)), _) => avx512::wide::<R, W>(
                    inputs.group(ops.r0),
                    weights.rows_from(ops.j0),
                    inputs.blocks,
                ),
                (None, Some(_)) if R > 1 => by_packing!(few_rows),
                _ => by_packing!(main),
            }
        },
    };
    if isa != Isa::Portable {
        if let Some(mins) = ops.mins::<R, W>() {
            for (row, mins) in out.iter_mut().zip(mins) {
                row.iter_mut().zip(mins).for_each(|(o, m)| *o += m);
            }
        }
    }
}

/// Pointers and strides one SIMD kernel call reads, bounds checked once.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
struct Rows<'a> {
    x: *const i8,
    cols: usize,
    x_scales: &'a [f32],
    w: *const i8,
    row_stride: usize,
    block_stride: usize,
    half_scales: &'a [f32],
    blocks: usize,
    packing: Packing,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    ahead: usize,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl<'a> Rows<'a> {
    fn new(ops: &'a Operands, rows: usize, weight_rows: usize) -> Rows<'a> {
        let (blocks, cols) = (ops.blocks(), ops.inputs.cols);
        assert!(ops.inputs.values.len() >= (ops.r0 + rows) * cols);
        ops.values.check(ops.j0, weight_rows, blocks);
        Rows {
            x: ops.inputs.values[ops.r0 * cols..].as_ptr(),
            cols,
            x_scales: &ops.inputs.scales[ops.r0 * blocks..][..rows * blocks],
            w: ops.values.data[ops.values.at(ops.j0, 0)..].as_ptr(),
            row_stride: ops.values.row_stride,
            block_stride: ops.values.block_stride,
            half_scales: if ops.own_scales {
                &[]
            } else {
                &ops.weights.half_scales[ops.j0 * 2 * blocks..][..weight_rows * 2 * blocks]
            },
            blocks,
            packing: ops.values.packing,
            ahead: ops.values.ahead,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;
