//! A weight matrix `W` (`rows x cols`, applied as `x W^T`) and its product.

use crate::dot::dot_block;
use crate::{AffineBlocks, Encoding, Format, GgmlBlocks, QuantError};
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Weight rows are decoded a tile at a time, once per call, and every
    /// input row is dotted with the decoded tile; each element is one
    /// [`dot`] in the fixed order, computed alongside others (see
    /// [`crate::dot`]), so its value does not depend on `m` or the split.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.rows, self.cols);
        assert!(
            x.len() >= m * k && out.len() >= m * n,
            "matmul buffers too small"
        );
        if m == 0 || n == 0 {
            return;
        }
        if let Some((format, bytes)) = self.integer_blocks() {
            let product = crate::integer::Product {
                format,
                bytes,
                rows: n,
                out,
            };
            crate::integer::matmul(&mut [product], k, x, m);
            return;
        }
        let tiles = n.div_ceil(TILE);
        let out = OutPtr(out.as_mut_ptr());
        let run = |t: usize| {
            DECODED.with_borrow_mut(|buf| {
                if buf.len() < TILE * k {
                    buf.resize(TILE * k, 0.0);
                }
                // SAFETY: tile `t` writes only columns `t * TILE..` (below
                // `n`) of the `m` output rows, which the assert above keeps
                // in bounds; no other tile writes them.
                unsafe { self.tile(t, x, m, buf, out) }
            })
        };
        let threads = rayon::current_num_threads();
        if threads == 1 || n * k * m < SERIAL_WORK {
            (0..tiles).for_each(run);
        } else {
            // A few tasks per thread: enough to balance, few enough that
            // the scheduling costs little next to a tile's work.
            let per_task = tiles.div_ceil(threads * TASKS_PER_THREAD).max(1);
            (0..tiles)
                .into_par_iter()
                .with_min_len(per_task)
                .for_each(run);
        }
    }

    /// This matrix's format and GGUF bytes, when the integer kernels take
    /// it (and they are on).
    fn integer_blocks(&self) -> Option<(Format, &[u8])> {
        match &self.storage {
            Storage::Ggml(blocks)
                if crate::integer::layout(blocks.format()).is_some() && integer_products() =>
            {
                Some((blocks.format(), blocks.as_bytes()))
            }
            _ => None,
        }
    }

    /// `outs[i]` = [`Matrix::matmul`] of `matrices[i]` with the same `m`
    /// rows of `x` (all `cols` wide), each output with the bits it has
    /// alone. Integer products share one quantization of the inputs and
    /// one parallel pass (a layer's q, k and v, or gate and up).
    pub fn matmul_each(matrices: &[&Matrix], x: &[f32], m: usize, outs: &mut [&mut [f32]]) {
        assert_eq!(matrices.len(), outs.len(), "one output per matrix");
        let cols = matrices.first().map_or(0, |w| w.cols);
        let mut products = Vec::with_capacity(matrices.len());
        for (w, out) in matrices.iter().zip(outs.iter_mut()) {
            assert_eq!(w.cols, cols, "matrices of one input width");
            match w.integer_blocks() {
                Some((format, bytes)) => products.push(crate::integer::Product {
                    format,
                    bytes,
                    rows: w.rows,
                    out,
                }),
                None => w.matmul(x, m, out),
            }
        }
        if !products.is_empty() {
            crate::integer::matmul(&mut products, cols, x, m);
        }
    }

    /// Decodes tile `t` (if stored quantized) and computes its columns for
    /// all `m` rows.
    ///
    /// # Safety
    /// `out` must be valid for writes of `m * rows` floats, and no other
    /// thread may write this tile's columns meanwhile.
    unsafe fn tile(&self, t: usize, x: &[f32], m: usize, buf: &mut [f32], out: OutPtr) {
        let (n, k) = (self.rows, self.cols);
        let j0 = t * TILE;
        let tw = TILE.min(n - j0);
        let w: &[f32] = match &self.storage {
            Storage::F32(v) => &v[j0 * k..(j0 + tw) * k],
            _ => {
                for (r, row) in buf.chunks_exact_mut(k).take(tw).enumerate() {
                    self.row_f32(j0 + r, row);
                }
                &buf[..tw * k]
            }
        };
        let mut i = 0;
        while i < m {
            // Kernel shapes keep 8 to 9 FMA chains in flight per thread.
            let r = (m - i).min(4);
            // SAFETY: rows `i..i + r` of `x` are in bounds (`x.len() >= m * k`),
            // `w` holds `tw` rows of `k`; output bounds are the caller's.
            unsafe {
                match r {
                    4 => block_rows::<4, 2>(x, i, k, w, tw, out, n, j0),
                    3 => block_rows::<3, 3>(x, i, k, w, tw, out, n, j0),
                    2 => block_rows::<2, 4>(x, i, k, w, tw, out, n, j0),
                    _ => block_rows::<1, 8>(x, i, k, w, tw, out, n, j0),
                }
            }
            i += r;
        }
    }
}

static FLOAT_PRODUCTS: AtomicBool = AtomicBool::new(false);

/// Makes block-quantized weights multiply as decoded f32 values instead of
/// in integers (as `TENSORFOLD_CPU_KERNELS=float` does at start): the float
/// product is kept to measure the integer one's quality against.
pub fn set_float_products(on: bool) {
    FLOAT_PRODUCTS.store(on, Ordering::Relaxed);
}

fn integer_products() -> bool {
    static FROM_ENV: std::sync::Once = std::sync::Once::new();
    FROM_ENV.call_once(|| {
        if std::env::var("TENSORFOLD_CPU_KERNELS").as_deref() == Ok("float") {
            set_float_products(true);
        }
    });
    !FLOAT_PRODUCTS.load(Ordering::Relaxed)
}

/// Weight rows decoded together; each is decoded once per call and reused
/// by every input row. Eight rows of the widest SmolLM2 input stay in L2.
const TILE: usize = 8;

/// Below this many multiply-adds a matmul runs on the calling thread.
const SERIAL_WORK: usize = 1 << 15;

const TASKS_PER_THREAD: usize = 4;

thread_local! {
    /// The decoded tile, reused across calls.
    static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The output buffer, shared by tiles that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tiles write disjoint elements (see `Matrix::matmul`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Rows `i..i + R` of `x` against the `tw` weight rows of `w`, `W` at a time.
///
/// # Safety
/// `x` holds rows `i..i + R` of `k`; `out` is valid for `(i + R) * n`
/// floats and columns `j0..j0 + tw` of those rows are this caller's.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block_rows<const R: usize, const W: usize>(
    x: &[f32],
    i: usize,
    k: usize,
    w: &[f32],
    tw: usize,
    out: OutPtr,
    n: usize,
    j0: usize,
) {
    assert!(x.len() >= (i + R) * k && w.len() >= tw * k);
    let xp = x[i * k..].as_ptr();
    let put = |j: usize, r: usize, v: f32| {
        // SAFETY: `(i + r) * n + j0 + j` is below `(i + R) * n`, in this
        // caller's columns.
        unsafe { *out.0.add((i + r) * n + j0 + j) = v }
    };
    let mut j = 0;
    while j + W <= tw {
        let mut o = [[0f32; W]; R];
        // SAFETY: `R` rows of `x` and weight rows `j..j + W < tw` are in bounds.
        unsafe { dot_block::<R, W>(xp, k, w[j * k..].as_ptr(), k, k, &mut o) };
        for (r, row) in o.iter().enumerate() {
            for (jj, &v) in row.iter().enumerate() {
                put(j + jj, r, v);
            }
        }
        j += W;
    }
    while j < tw {
        let mut o = [[0f32; 1]; R];
        // SAFETY: as above, one weight row.
        unsafe { dot_block::<R, 1>(xp, k, w[j * k..].as_ptr(), k, k, &mut o) };
        for (r, row) in o.iter().enumerate() {
            put(j, r, row[0]);
        }
        j += 1;
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
    use crate::testing::values;
    use proptest::prelude::*;

    const FORMATS: [Format; 13] = Format::ALL;

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
                    // Integer kernels quantize the inputs to 8 bits per block.
                    let tolerance = if crate::integer::layout(f).is_some() {
                        (0..k)
                            .map(|c| (x[i * k + c] as f64 * row[c] as f64).abs())
                            .sum::<f64>()
                            * 0.01
                    } else {
                        1e-3
                    };
                    assert!((out[i * n + j] as f64 - exact).abs() < tolerance, "{f}");
                }
            }
        }
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        assert!(Matrix::from_bytes(Format::Q4_1, 2, 32, &[0u8; 39]).is_err());
        assert!(Matrix::from_bytes(Format::Q4K, 2, 100, &[0u8; 0]).is_err());
    }

    /// Every row of every call height 1..=17 (all kernel shapes and their
    /// remainders, a partial last tile) has the bits of the portable order
    /// applied to the decoded weights, for the formats the float kernels
    /// take (the integer kernels test their own order).
    #[test]
    fn rows_equal_the_portable_order_for_every_height() {
        let (n, k) = (21, 288);
        for f in [Format::F32, Format::F16, Format::Bf16, Format::Q3K] {
            let k = if f.block_elems() == 256 {
                256
            } else {
                k + 3 * (f == Format::F32) as usize
            };
            let w = Matrix::from_f32(f, n, k, &values(n * k, 5)).unwrap();
            let x = values(17 * k, 6);
            let mut row = vec![0.0; k];
            let want: Vec<u32> = (0..17 * n)
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    w.row_f32(j, &mut row);
                    crate::dot_portable(&x[i * k..(i + 1) * k], &row).to_bits()
                })
                .collect();
            for m in 1..=17 {
                let mut out = vec![0.0; m * n];
                w.matmul(&x, m, &mut out);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want[..m * n], "{f} m={m}");
            }
        }
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
