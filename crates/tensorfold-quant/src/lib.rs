//! Weight matrices in every storage format TensorFold reads, and the one
//! matrix product the engine uses.
//!
//! The product is *row-invariant*: output element `(i, j)` is computed by
//! the same instructions in the same order whatever the number of rows `m`
//! in the call, so a position's logits are bitwise equal whether it is
//! decoded alone, verified among drafts or prefilled in a chunk. The order
//! is fixed by the weight shape alone (see [`dot`]).

#![deny(unsafe_op_in_unsafe_fn)]

mod affine;
mod dot;
mod ggml;
mod integer;
mod matrix;

/// Deterministic pseudo-random weights in [-0.5, 0.5) for the unit tests.
#[cfg(test)]
mod testing {
    pub fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }
}

pub use affine::{
    pack, unpack, Affine, AffineBlocks, QuantRule, ScaleDtype, AFFINE_BITS, AFFINE_GROUPS,
};
pub use dot::{dot, dot_portable, sum_squares};
pub use ggml::GgmlBlocks;
pub use matrix::{set_float_products, Matrix, Storage};

/// Storage formats a weight can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

impl Format {
    /// Every format, floats first.
    pub const ALL: [Format; 13] = [
        Format::F32,
        Format::F16,
        Format::Bf16,
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q8_0,
        Format::Q2K,
        Format::Q3K,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
    ];

    /// Elements per quantization block (1 for float formats).
    pub fn block_elems(self) -> usize {
        match self {
            Format::F32 | Format::F16 | Format::Bf16 => 1,
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q5_1 | Format::Q8_0 => 32,
            Format::Q2K | Format::Q3K | Format::Q4K | Format::Q5K | Format::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::F16 | Format::Bf16 => 2,
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q5_0 => 22,
            Format::Q5_1 => 24,
            Format::Q8_0 => 34,
            Format::Q2K => 84,
            Format::Q3K => 110,
            Format::Q4K => 144,
            Format::Q5K => 176,
            Format::Q6K => 210,
        }
    }

    /// Bytes a `rows x cols` matrix takes in this format.
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> usize {
        rows * cols / self.block_elems() * self.block_bytes()
    }

    /// The name GGUF tooling uses.
    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "F32",
            Format::F16 => "F16",
            Format::Bf16 => "BF16",
            Format::Q4_0 => "Q4_0",
            Format::Q4_1 => "Q4_1",
            Format::Q5_0 => "Q5_0",
            Format::Q5_1 => "Q5_1",
            Format::Q8_0 => "Q8_0",
            Format::Q2K => "Q2_K",
            Format::Q3K => "Q3_K",
            Format::Q4K => "Q4_K",
            Format::Q5K => "Q5_K",
            Format::Q6K => "Q6_K",
        }
    }

    /// Maps candle's GGML dtype; `None` for types TensorFold does not run.
    pub fn from_ggml(dtype: candle_core::quantized::GgmlDType) -> Option<Format> {
        use candle_core::quantized::GgmlDType as G;
        Some(match dtype {
            G::F32 => Format::F32,
            G::F16 => Format::F16,
            G::BF16 => Format::Bf16,
            G::Q4_0 => Format::Q4_0,
            G::Q4_1 => Format::Q4_1,
            G::Q5_0 => Format::Q5_0,
            G::Q5_1 => Format::Q5_1,
            G::Q8_0 => Format::Q8_0,
            G::Q2K => Format::Q2K,
            G::Q3K => Format::Q3K,
            G::Q4K => Format::Q4K,
            G::Q5K => Format::Q5K,
            G::Q6K => Format::Q6K,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a matrix is stored: a [`Format`] (float or GGUF block type), or MLX
/// affine groups with scales and biases of a [`ScaleDtype`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Plain(Format),
    Affine(Affine, ScaleDtype),
}

impl Encoding {
    pub fn name(&self) -> String {
        match self {
            Encoding::Plain(f) => f.name().to_string(),
            Encoding::Affine(a, _) => a.to_string(),
        }
    }

    /// Bytes a `rows x cols` matrix takes (all three tensors for affine).
    pub fn matrix_bytes(&self, rows: usize, cols: usize) -> usize {
        match self {
            Encoding::Plain(f) => f.matrix_bytes(rows, cols),
            Encoding::Affine(a, d) => {
                rows * a.row_words(cols) * 4 + 2 * rows * (cols / a.group()) * d.bytes()
            }
        }
    }
}

impl From<Format> for Encoding {
    fn from(f: Format) -> Encoding {
        Encoding::Plain(f)
    }
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Errors building a weight matrix.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("{format} weight of {rows}x{cols}: expected {expected} bytes, got {got}")]
    Size {
        format: Format,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("{format} needs rows of a multiple of {block} elements, got {cols}")]
    Shape {
        format: Format,
        cols: usize,
        block: usize,
    },
    #[error("affine weight: {0}")]
    Affine(String),
}
