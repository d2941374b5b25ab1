//! GGUF block-quantized storage, decoded with candle's block definitions.

use crate::{Format, QuantError};
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType,
};

/// A matrix's quantized blocks, row after row, typed by format.
#[derive(Clone)]
pub enum GgmlBlocks {
    Q4_0(Vec<BlockQ4_0>),
    Q4_1(Vec<BlockQ4_1>),
    Q5_0(Vec<BlockQ5_0>),
    Q5_1(Vec<BlockQ5_1>),
    Q8_0(Vec<BlockQ8_0>),
    Q2K(Vec<BlockQ2K>),
    Q3K(Vec<BlockQ3K>),
    Q4K(Vec<BlockQ4K>),
    Q5K(Vec<BlockQ5K>),
    Q6K(Vec<BlockQ6K>),
}

/// Copies raw little-endian GGUF bytes into typed blocks.
fn blocks_from_bytes<T: GgmlType>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    assert_eq!(bytes.len() % size, 0, "block bytes must be whole blocks");
    let n = bytes.len() / size;
    let mut out: Vec<T> = (0..n).map(|_| T::zeros()).collect();
    // SAFETY: candle's block types are `repr(C)` plain data (f16 and byte
    // arrays) whose size equals the GGUF block size (checked by the caller
    // against `Format::block_bytes`), so any byte pattern is a valid value;
    // `out` holds exactly `bytes.len()` bytes and the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr() as *mut u8, bytes.len());
    }
    out
}

fn blocks_to_bytes<T>(blocks: &[T]) -> &[u8] {
    // SAFETY: plain-data blocks (see above) viewed as their bytes.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr() as *const u8, std::mem::size_of_val(blocks))
    }
}

macro_rules! each_format {
    ($self:expr, $v:ident => $body:expr) => {
        match $self {
            GgmlBlocks::Q4_0($v) => $body,
            GgmlBlocks::Q4_1($v) => $body,
            GgmlBlocks::Q5_0($v) => $body,
            GgmlBlocks::Q5_1($v) => $body,
            GgmlBlocks::Q8_0($v) => $body,
            GgmlBlocks::Q2K($v) => $body,
            GgmlBlocks::Q3K($v) => $body,
            GgmlBlocks::Q4K($v) => $body,
            GgmlBlocks::Q5K($v) => $body,
            GgmlBlocks::Q6K($v) => $body,
        }
    };
}

impl GgmlBlocks {
    /// Builds from raw bytes; `format` must be a block-quantized format.
    pub fn from_bytes(format: Format, bytes: &[u8]) -> Result<GgmlBlocks, QuantError> {
        fn check<T>(format: Format) {
            assert_eq!(
                std::mem::size_of::<T>(),
                format.block_bytes(),
                "{format} block layout"
            );
        }
        macro_rules! make {
            ($variant:ident, $ty:ty) => {{
                check::<$ty>(format);
                GgmlBlocks::$variant(blocks_from_bytes::<$ty>(bytes))
            }};
        }
        Ok(match format {
            Format::Q4_0 => make!(Q4_0, BlockQ4_0),
            Format::Q4_1 => make!(Q4_1, BlockQ4_1),
            Format::Q5_0 => make!(Q5_0, BlockQ5_0),
            Format::Q5_1 => make!(Q5_1, BlockQ5_1),
            Format::Q8_0 => make!(Q8_0, BlockQ8_0),
            Format::Q2K => make!(Q2K, BlockQ2K),
            Format::Q3K => make!(Q3K, BlockQ3K),
            Format::Q4K => make!(Q4K, BlockQ4K),
            Format::Q5K => make!(Q5K, BlockQ5K),
            Format::Q6K => make!(Q6K, BlockQ6K),
            Format::F32 | Format::F16 | Format::Bf16 => {
                unreachable!("float formats are not block-quantized")
            }
        })
    }

    /// Quantizes `rows x cols` f32 values (row-major) with candle's reference
    /// quantizers.
    pub fn quantize(format: Format, values: &[f32]) -> GgmlBlocks {
        macro_rules! make {
            ($variant:ident, $ty:ty) => {{
                let n = values.len() / <$ty>::BLCK_SIZE;
                let mut blocks: Vec<$ty> = (0..n).map(|_| <$ty>::zeros()).collect();
                <$ty>::from_float(values, &mut blocks);
                GgmlBlocks::$variant(blocks)
            }};
        }
        match format {
            Format::Q4_0 => make!(Q4_0, BlockQ4_0),
            Format::Q4_1 => make!(Q4_1, BlockQ4_1),
            Format::Q5_0 => make!(Q5_0, BlockQ5_0),
            Format::Q5_1 => make!(Q5_1, BlockQ5_1),
            Format::Q8_0 => make!(Q8_0, BlockQ8_0),
            Format::Q2K => make!(Q2K, BlockQ2K),
            Format::Q3K => make!(Q3K, BlockQ3K),
            Format::Q4K => make!(Q4K, BlockQ4K),
            Format::Q5K => make!(Q5K, BlockQ5K),
            Format::Q6K => make!(Q6K, BlockQ6K),
            Format::F32 | Format::F16 | Format::Bf16 => {
                unreachable!("float formats are not block-quantized")
            }
        }
    }

    pub fn format(&self) -> Format {
        match self {
            GgmlBlocks::Q4_0(_) => Format::Q4_0,
            GgmlBlocks::Q4_1(_) => Format::Q4_1,
            GgmlBlocks::Q5_0(_) => Format::Q5_0,
            GgmlBlocks::Q5_1(_) => Format::Q5_1,
            GgmlBlocks::Q8_0(_) => Format::Q8_0,
            GgmlBlocks::Q2K(_) => Format::Q2K,
            GgmlBlocks::Q3K(_) => Format::Q3K,
            GgmlBlocks::Q4K(_) => Format::Q4K,
            GgmlBlocks::Q5K(_) => Format::Q5K,
            GgmlBlocks::Q6K(_) => Format::Q6K,
        }
    }

    /// The blocks as GGUF stores them.
    pub fn as_bytes(&self) -> &[u8] {
        each_format!(self, v => blocks_to_bytes(v))
    }

    /// Decodes row `row` of a matrix with `cols` columns into `out`.
    pub fn dequantize_row(&self, row: usize, cols: usize, out: &mut [f32]) {
        let per_row = cols / self.format().block_elems();
        each_format!(self, v => {
            let blocks = &v[row * per_row..(row + 1) * per_row];
            GgmlType::to_float(blocks, &mut out[..cols]);
        })
    }
}
