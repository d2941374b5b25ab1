//! A weight matrix `W` (`rows x cols`, applied as `x W^T`) and its product.

use crate::{dot, AffineBlocks, Encoding, Format, GgmlBlocks, QuantError};
use half::{bf16, f16};
use rayon::prelude::*;

/// How a matrix's values are stored.
#[derive(Clone)]
pub enum Storage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Ggml(GgmlBlocks),
    Affine(AffineBlocks),
}

/// A weight matrix: `rows` output features by `cols` input features.
#[derive(Clone)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    storage: Storage,
}

/// Output features each parallel task computes. Tasks only split the work:
/// every element is one [`dot`] whatever the split.
const TASK_ROWS: usize = 16;

impl Matrix {
    pub fn new(rows: usize, cols: usize, storage: Storage) -> Result<Matrix, QuantError> {
        let format = match storage_format(&storage) {
            Encoding::Plain(f) => f,
            Encoding::Affine(..) => return Matrix::new_affine(rows, cols, storage),
        };
        let block = format.block_elems();
        if !cols.is_multiple_of(block) {
            return Err(QuantError::Shape {
                format,
                cols,
                block,
            });
        }
        let got = match &storage {
            Storage::F32(v) => v.len() * 4,
            Storage::F16(v) => v.len() * 2,
            Storage::Bf16(v) => v.len() * 2,
            Storage::Ggml(b) => b.as_bytes().len(),
            Storage::Affine(_) => unreachable!("checked above"),
        };
        let expected = format.matrix_bytes(rows, cols);
        if got != expected {
            return Err(QuantError::Size {
                format,
                rows,
                cols,
                expected,
                got,
            });
        }
        Ok(Matrix {
            rows,
            cols,
            storage,
        })
    }

    /// Affine blocks carry their own shape; it must be the matrix's.
    fn new_affine(rows: usize, cols: usize, storage: Storage) -> Result<Matrix, QuantError> {
        if let Storage::Affine(a) = &storage {
            if (a.rows(), a.cols()) != (rows, cols) {
                return Err(QuantError::Affine(format!(
                    "{}x{} blocks for a {rows}x{cols} matrix",
                    a.rows(),
                    a.cols()
                )));
            }
        }
        Ok(Matrix {
            rows,
            cols,
            storage,
        })
    }

    /// Builds from GGUF-layout bytes of the given format.
    pub fn from_bytes(
        format: Format,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Matrix, QuantError> {
        let expected = format.matrix_bytes(rows, cols);
        if bytes.len() != expected || !cols.is_multiple_of(format.block_elems()) {
            return Err(QuantError::Size {
                format,
                rows,
                cols,
                expected,
                got: bytes.len(),
            });
        }
        let storage = match format {
            Format::F32 => Storage::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Format::F16 => Storage::F16(
                bytes
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            Format::Bf16 => Storage::Bf16(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            q => Storage::Ggml(GgmlBlocks::from_bytes(q, bytes)?),
        };
        Matrix::new(rows, cols, storage)
    }

    /// Stores f32 values (row-major) in `encoding`, quantizing if needed.
    pub fn from_f32(
        encoding: impl Into<Encoding>,
        rows: usize,
        cols: usize,
        values: &[f32],
    ) -> Result<Matrix, QuantError> {
        assert_eq!(values.len(), rows * cols, "values must be rows x cols");
        let format = match encoding.into() {
            Encoding::Plain(f) => f,
            Encoding::Affine(a, d) => {
                let blocks = AffineBlocks::quantize(a, d, rows, cols, values)?;
                return Matrix::new(rows, cols, Storage::Affine(blocks));
            }
        };
        let storage = match format {
            Format::F32 => Storage::F32(values.to_vec()),
            Format::F16 => Storage::F16(values.iter().map(|&v| f16::from_f32(v)).collect()),
            Format::Bf16 => Storage::Bf16(values.iter().map(|&v| bf16::from_f32(v)).collect()),
            q => {
                if !cols.is_multiple_of(q.block_elems()) {
                    return Err(QuantError::Shape {
                        format: q,
                        cols,
                        block: q.block_elems(),
                    });
                }
                Storage::Ggml(GgmlBlocks::quantize(q, values))
            }
        };
        Matrix::new(rows, cols, storage)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn format(&self) -> Encoding {
        storage_format(&self.storage)
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Bytes the stored values take.
    pub fn bytes(&self) -> usize {
        self.format().matrix_bytes(self.rows, self.cols)
    }

    /// Decodes row `r` into `out[..cols]`.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let (c, out) = (self.cols, &mut out[..self.cols]);
        match &self.storage {
            Storage::F32(v) => out.copy_from_slice(&v[r * c..(r + 1) * c]),
            Storage::F16(v) => out
                .iter_mut()
                .zip(&v[r * c..(r + 1) * c])
                .for_each(|(o, w)| *o = w.to_f32()),
            Storage::Bf16(v) => out
                .iter_mut()
                .zip(&v[r * c..(r + 1) * c])
                .for_each(|(o, w)| *o = w.to_f32()),
            Storage::Ggml(b) => b.dequantize_row(r, c, out),
            Storage::Affine(a) => a.dequantize_row(r, out),
        }
    }

    /// `out[i * rows + j] = dot(x[i * cols..], row j of W)` for `m` rows of `x`.
    ///
    /// Each weight row is decoded once per call and dotted with every input
    /// row; the value of each element does not depend on `m`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.rows, self.cols);
        assert!(
            x.len() >= m * k && out.len() >= m * n,
            "matmul buffers too small"
        );
        // Tasks own disjoint column ranges of `out`; gather them per task and
        // scatter afterwards so each task writes one contiguous buffer.
        let tasks: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(TASK_ROWS))
            .into_par_iter()
            .map(|t| {
                let (j0, j1) = (t * TASK_ROWS, ((t + 1) * TASK_ROWS).min(n));
                let mut w = vec![0f32; k];
                let mut part = vec![0f32; m * (j1 - j0)];
                for j in j0..j1 {
                    let w_row: &[f32] = match &self.storage {
                        Storage::F32(v) => &v[j * k..(j + 1) * k],
                        _ => {
                            self.row_f32(j, &mut w);
                            &w
                        }
                    };
                    for i in 0..m {
                        part[i * (j1 - j0) + (j - j0)] = dot(&x[i * k..(i + 1) * k], w_row);
                    }
                }
                (j0, part)
            })
            .collect();
        for (j0, part) in tasks {
            let width = part.len() / m.max(1);
            for i in 0..m {
                out[i * n + j0..i * n + j0 + width]
                    .copy_from_slice(&part[i * width..(i + 1) * width]);
            }
        }
    }
}

fn storage_format(storage: &Storage) -> Encoding {
    match storage {
        Storage::F32(_) => Format::F32.into(),
        Storage::F16(_) => Format::F16.into(),
        Storage::Bf16(_) => Format::Bf16.into(),
        Storage::Ggml(b) => b.format().into(),
        Storage::Affine(a) => Encoding::Affine(a.spec(), a.scale_dtype()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
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

    const FORMATS: [Format; 13] = [
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

    #[test]
    fn bytes_round_trip_every_format() {
        for f in FORMATS {
            let w = Matrix::from_f32(f, 3, 256, &values(768, 1)).unwrap();
            let raw: Vec<u8> = match w.storage() {
                Storage::Ggml(b) => b.as_bytes().to_vec(),
                Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Storage::Affine(_) => unreachable!("plain formats only"),
            };
            let back = Matrix::from_bytes(f, 3, 256, &raw).unwrap();
            let (mut a, mut b) = (vec![0.0; 256], vec![0.0; 256]);
            for r in 0..3 {
                w.row_f32(r, &mut a);
                back.row_f32(r, &mut b);
                assert_eq!(a, b, "{f}");
            }
        }
    }

    #[test]
    fn matmul_is_close_to_f64_for_every_format() {
        let (n, k, m) = (40, 256, 3);
        let src = values(n * k, 2);
        let x = values(m * k, 3);
        for f in FORMATS {
            let w = Matrix::from_f32(f, n, k, &src).unwrap();
            let mut out = vec![0.0; m * n];
            w.matmul(&x, m, &mut out);
            let mut row = vec![0.0; k];
            for j in 0..n {
                w.row_f32(j, &mut row);
                for i in 0..m {
                    let exact: f64 = (0..k).map(|c| x[i * k + c] as f64 * row[c] as f64).sum();
                    assert!((out[i * n + j] as f64 - exact).abs() < 1e-3, "{f}");
                }
            }
        }
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        assert!(Matrix::from_bytes(Format::Q4_1, 2, 32, &[0u8; 39]).is_err());
        assert!(Matrix::from_bytes(Format::Q4K, 2, 100, &[0u8; 0]).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The row invariant: a row's outputs are the same bits whether it is
        /// computed alone or at any offset inside a call of any height.
        #[test]
        fn rows_do_not_depend_on_the_call(
            f in proptest::sample::select(FORMATS.to_vec()),
            n in 1usize..70,
            kb in 1usize..3,
            m in 1usize..40,
            pick in 0usize..40,
            seed in 0u64..1000,
        ) {
            let k = kb * 256;
            let w = Matrix::from_f32(f, n, k, &values(n * k, seed)).unwrap();
            let x = values(m * k, seed + 1);
            let mut all = vec![0.0; m * n];
            w.matmul(&x, m, &mut all);
            let i = pick % m;
            let mut one = vec![0.0; n];
            w.matmul(&x[i * k..(i + 1) * k], 1, &mut one);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&all[i * n..(i + 1) * n]), bits(&one));
        }
    }
}
