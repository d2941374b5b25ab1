//! The product of GGUF block-quantized weights with input rows in integer
//! arithmetic, row-invariant by construction.
//!
//! Each input row is quantized on its own to 8 bits per element with one
//! scale per block of 32 ([`activations`]); weight rows are unpacked to
//! 8-bit integers with their block scales ([`unpack`]); a half block's 16
//! products are summed exactly in integers, and the half blocks' float
//! terms are folded in an order fixed by the row length alone
//! ([`kernel::reference`]). An
//! output element therefore has the same bits whatever else is in the call,
//! on every instruction set, and a verify window of several rows shares
//! each unpacked weight block.

mod activations;
mod kernel;
mod lanes;
mod scales;
mod unpack;
mod wide;

use crate::Format;
use activations::QuantizedRows;
use kernel::{Isa, Operands, Values};
use lanes::RowSpans;
use rayon::prelude::*;
use unpack::{Packing, UnpackedRows};
use wide::Inputs;

pub(crate) use unpack::layout;

/// Elements per quantization block.
const BLOCK: usize = 32;
/// Elements per half block: the unit of k-quants' sub-block scales.
const HALF: usize = 16;

/// Weight rows unpacked together; each tile is unpacked once per call and
/// used by every input row.
const TILE: usize = 16;

/// Below this many multiply-adds a product runs on the calling thread.
const SERIAL_WORK: usize = 1 << 15;

const TASKS_PER_THREAD: usize = 4;

/// A thread's buffers for the tile it works on: the unpacked weight rows
/// and, for the wide kernel, their records.
#[derive(Default)]
struct TileBuffers {
    unpacked: UnpackedRows,
    records: wide::Weights,
}

thread_local! {
    static TILE_BUFFERS: std::cell::RefCell<TileBuffers> = std::cell::RefCell::default();
}

/// One weight matrix of a product: `rows x cols` in `format`'s GGUF
/// layout, and where its `m x rows` outputs go.
pub(crate) struct Product<'a> {
    pub format: Format,
    pub bytes: &'a [u8],
    pub rows: usize,
    pub out: &'a mut [f32],
}

/// `product.out[i * rows + j] = x row i . weight row j` for `m` rows of `x`
/// and every product (all `cols` wide): the inputs are quantized once and
/// every product's tiles share one parallel pass.
pub(crate) fn matmul(products: &mut [Product], cols: usize, x: &[f32], m: usize) {
    matmul_with(Isa::detect(), products, cols, x, m)
}

fn matmul_with(isa: Isa, products: &mut [Product], cols: usize, x: &[f32], m: usize) {
    assert!(x.len() >= m * cols);
    for p in products.iter() {
        assert!(
            layout(p.format).is_some(),
            "{} has no integer kernel",
            p.format
        );
        assert!(p.out.len() >= m * p.rows);
        assert_eq!(p.bytes.len(), p.format.matrix_bytes(p.rows, cols));
    }
    if m == 0 {
        return;
    }
    let inputs = QuantizedRows::new(x, m, cols);
    let wide = isa
        .wide_from()
        .filter(|&from| m >= from)
        .map(|_| Inputs::new(&inputs, m));
    let lanes =
        (isa.reads_in_lanes() && m > 1 && wide.is_none()).then(|| RowSpans::new(&inputs, m));
    // Every product's tiles, in order: (product, first row).
    let tiles: Vec<(usize, usize)> = products
        .iter()
        .enumerate()
        .flat_map(|(p, product)| (0..product.rows).step_by(TILE).map(move |j0| (p, j0)))
        .collect();
    let targets: Vec<(Format, &[u8], usize, OutPtr)> = products
        .iter_mut()
        .map(|p| (p.format, p.bytes, p.rows, OutPtr(p.out.as_mut_ptr())))
        .collect();
    let run = |&(p, j0): &(usize, usize)| {
        let (format, bytes, rows, out) = targets[p];
        // SAFETY: the tile writes columns `j0..` of its product's `m` output
        // rows, in bounds (asserted above) and written by no other tile.
        unsafe {
            tile(
                isa,
                &inputs,
                wide.as_ref(),
                lanes.as_ref(),
                format,
                bytes,
                rows,
                cols,
                j0,
                m,
                out,
            )
        }
    };
    let work: usize = products.iter().map(|p| p.rows).sum::<usize>() * cols * m;
    let threads = rayon::current_num_threads();
    if threads == 1 || work < SERIAL_WORK {
        tiles.iter().for_each(run);
    } else {
        let per_task = tiles.len().div_ceil(threads * TASKS_PER_THREAD).max(1);
        tiles.par_iter().with_min_len(per_task).for_each(run);
    }
}

/// Unpacks the tile of weight rows from `j0` and computes its columns of
/// all `m` output rows (with the wide kernel where `wide` holds the inputs'
/// records).
///
/// # Safety
/// `out` must be valid for `m * rows` floats, and no other thread may write
/// this tile's columns meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    isa: Isa,
    inputs: &QuantizedRows,
    wide: Option<&Inputs>,
    lanes: Option<&RowSpans>,
    format: Format,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    j0: usize,
    m: usize,
    out: OutPtr,
) {
    let layout = layout(format).expect("checked by the caller");
    let width = TILE.min(rows - j0);
    let row_bytes = format.matrix_bytes(1, cols);
    TILE_BUFFERS.with_borrow_mut(|buffers| {
        let TileBuffers { unpacked, records } = buffers;
        let tile = &bytes[j0 * row_bytes..][..width * row_bytes];
        let next = &bytes[(j0 + width) * row_bytes..];
        let next = &next[..next.len().min(tile.len())];
        // The wide kernel reads records of bytes, laid out once here.
        let packed = layout
            .packed
            .filter(|_| isa.reads_packed() && wide.is_none());
        // A kernel reading the GGUF bytes asks for the next tile's as it
        // goes, so that memory and arithmetic overlap; otherwise the next
        // tile is asked for at once, to arrive while this one is unpacked.
        let streams =
            isa.reads_packed() && wide.is_none() && (packed.is_some() || layout.in_place.is_some());
        let ahead = if streams && !next.is_empty() {
            tile.len()
        } else {
            prefetch(next);
            0
        };
        // Where the kernel reads the GGUF bytes, one row decodes the
        // scales there.
        let in_gguf_bytes = packed.is_some() || (layout.in_place.is_some() && wide.is_none());
        let own_scales = in_gguf_bytes && isa.decodes_scales(m);
        if !own_scales {
            unpacked.fill(format, tile, width, cols, packed.is_none());
        }
        // SAFETY: `u8` and `i8` have one size and alignment, and the slice
        // is only read.
        let tile_bytes =
            unsafe { std::slice::from_raw_parts(tile.as_ptr() as *const i8, tile.len()) };
        let values = match (packed, layout.in_place) {
            (Some(packing), _) => Values {
                data: tile_bytes,
                start: 0,
                row_stride: row_bytes,
                block_stride: format.block_bytes(),
                packing,
                ahead,
            },
            (None, Some(start)) => Values {
                data: tile_bytes,
                start,
                row_stride: row_bytes,
                block_stride: format.block_bytes(),
                packing: Packing::Bytes,
                ahead,
            },
            (None, None) => Values {
                data: &unpacked.values,
                start: 0,
                row_stride: cols,
                block_stride: BLOCK,
                packing: Packing::Bytes,
                ahead: 0,
            },
        };
        if wide.is_some() {
            records.fill(&values, &unpacked.half_scales, width, cols / BLOCK);
            if layout.block_mins {
                records.fill_mins(&unpacked.block_mins, width, &inputs.block_sums, m);
            }
        }
        // Calls start at multiples of a record group.
        const { assert!(kernel::MAX_ROWS == wide::ROWS) };
        let most = isa.rows_per_call(wide.is_some());
        let mut i = 0;
        while i < m {
            let height = (m - i).min(most);
            let ops = Operands {
                inputs,
                r0: i,
                weights: unpacked,
                values,
                j0: 0,
                layout,
                wide: wide.map(|inputs| (inputs, &*records)),
                lanes,
                own_scales,
            };
            // SAFETY: rows `i..i + height`, columns `j0..j0 + width`: the
            // caller's.
            unsafe {
                match (height, isa.wider(), wide.is_some()) {
                    (9, _, _) => tile_rows::<9, 4>(isa, ops, width, out, rows, j0),
                    (8, _, _) => tile_rows::<8, 4>(isa, ops, width, out, rows, j0),
                    (7, _, _) => tile_rows::<7, 4>(isa, ops, width, out, rows, j0),
                    (6, _, _) => tile_rows::<6, 4>(isa, ops, width, out, rows, j0),
                    (5, _, _) => tile_rows::<5, 4>(isa, ops, width, out, rows, j0),
                    (4, _, _) => tile_rows::<4, 4>(isa, ops, width, out, rows, j0),
                    (3, _, _) => tile_rows::<3, 4>(isa, ops, width, out, rows, j0),
                    (2, _, true) => tile_rows::<2, 4>(isa, ops, width, out, rows, j0),
                    (2, true, false) => tile_rows::<2, 4>(isa, ops, width, out, rows, j0),
                    (2, false, _) => tile_rows::<2, 2>(isa, ops, width, out, rows, j0),
                    (_, true, _) => tile_rows::<1, 8>(isa, ops, width, out, rows, j0),
                    _ => tile_rows::<1, 4>(isa, ops, width, out, rows, j0),
                }
            }
            i += height;
        }
    })
}

/// Asks for the next tile (into L2) while this one is unpacked.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn prefetch(next: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in next.chunks(64) {
        // SAFETY: a prefetch of an address inside `next`; it reads nothing.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                line.as_ptr() as *const i8
            )
        };
    }
}

/// The output buffer, shared by tiles that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tiles write disjoint elements (see `matmul_with`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Input rows `ops.r0..+R` against the tile's `width` weight rows, `W` at
/// a time, written to columns `j0..j0 + width` of `out` (`n` wide).
///
/// # Safety
/// Those elements of `out` must be in bounds and this caller's alone.
unsafe fn tile_rows<const R: usize, const W: usize>(
    isa: Isa,
    mut ops: Operands,
    width: usize,
    out: OutPtr,
    n: usize,
    j0: usize,
) {
    let r0 = ops.r0;
    let put = |j: usize, r: usize, v: f32| {
        // SAFETY: the caller's bounds.
        unsafe { *out.0.add((r0 + r) * n + j0 + j) = v }
    };
    let mut j = 0;
    while j + W <= width {
        ops.j0 = j;
        let mut o = [[0f32; W]; R];
        kernel::dots::<R, W>(isa, &ops, &mut o);
        for (r, row) in o.iter().enumerate() {
            for (jj, &v) in row.iter().enumerate() {
                put(j + jj, r, v);
            }
        }
        j += W;
    }
    while j < width {
        ops.j0 = j;
        let mut o = [[0f32; 1]; R];
        kernel::dots::<R, 1>(isa, &ops, &mut o);
        for (r, row) in o.iter().enumerate() {
            put(j, r, row[0]);
        }
        j += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::values;
    use crate::{Matrix, Storage};

    fn formats() -> impl Iterator<Item = Format> {
        Format::ALL.into_iter().filter(|f| layout(*f).is_some())
    }

    fn quantized(format: Format, rows: usize, cols: usize, seed: u64) -> Matrix {
        Matrix::from_f32(format, rows, cols, &values(rows * cols, seed)).unwrap()
    }

    fn bytes(w: &Matrix) -> &[u8] {
        match w.storage() {
            Storage::Ggml(b) => b.as_bytes(),
            _ => unreachable!("quantized"),
        }
    }

    fn run(isa: Isa, w: &Matrix, x: &[f32], m: usize) -> Vec<u32> {
        let mut out = vec![0f32; m * w.rows()];
        let format = match w.format() {
            crate::Encoding::Plain(f) => f,
            _ => unreachable!(),
        };
        let mut products = [Product {
            format,
            bytes: bytes(w),
            rows: w.rows(),
            out: &mut out,
        }];
        matmul_with(isa, &mut products, w.cols(), x, m);
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// Several products in one pass give each its own bits.
    #[test]
    fn products_in_one_pass_equal_each_alone() {
        let k = 512;
        let x = values(3 * k, 21);
        let matrices = [
            quantized(Format::Q4_1, 40, k, 1),
            quantized(Format::Q6K, 8, k, 2),
            quantized(Format::Q8_0, 70, k, 3),
        ];
        let mut outs: Vec<Vec<f32>> = matrices.iter().map(|w| vec![0.0; 3 * w.rows()]).collect();
        let mut products: Vec<Product> = matrices
            .iter()
            .zip(outs.iter_mut())
            .map(|(w, out)| Product {
                format: match w.format() {
                    crate::Encoding::Plain(f) => f,
                    _ => unreachable!(),
                },
                bytes: bytes(w),
                rows: w.rows(),
                out,
            })
            .collect();
        matmul_with(Isa::detect(), &mut products, k, &x, 3);
        for (w, out) in matrices.iter().zip(&outs) {
            let alone: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            assert_eq!(alone, run(Isa::detect(), w, &x, 3));
        }
    }

    /// Every instruction set gives the reference's bits, for every call
    /// height (each kernel shape and its remainders, a partial tile).
    #[test]
    fn every_isa_and_height_gives_the_reference_bits() {
        for format in formats() {
            for cols in [256usize, 512 + 256, 256 + 32 * 3] {
                if !cols.is_multiple_of(format.block_elems()) {
                    continue;
                }
                let (n, k) = (37, cols);
                let w = quantized(format, n, k, 11);
                let wide = Isa::detect().wide_from().unwrap_or(16);
                let most = wide + 7;
                let x = values(most * k, 12);
                let want = run(Isa::Portable, &w, &x, most);
                for isa in Isa::available() {
                    // Few rows, and the wide kernel's heights where it runs.
                    let wide_heights = (wide..=wide + 3).chain([most]);
                    for m in (1..=9).chain([12, 13]).chain(wide_heights) {
                        let got = run(isa, &w, &x, m);
                        assert_eq!(got, want[..m * n], "{format} {isa:?} m={m}");
                    }
                    // A row alone equals the same row at any offset in a call.
                    for i in 0..most {
                        let one = run(isa, &w, &x[i * k..], 1);
                        assert_eq!(one, want[i * n..(i + 1) * n], "{format} {isa:?} row {i}");
                    }
                }
            }
        }
    }

    /// The integer product is close to the f64 product of the decoded
    /// weights with the unquantized inputs: within the error of 8-bit inputs.
    #[test]
    fn close_to_the_f64_product() {
        let (n, k, m) = (24, 512, 3);
        let x = values(m * k, 3);
        for format in formats() {
            let w = quantized(format, n, k, 2);
            let got: Vec<f32> = run(Isa::detect(), &w, &x, m)
                .into_iter()
                .map(f32::from_bits)
                .collect();
            let mut row = vec![0f32; k];
            for j in 0..n {
                w.row_f32(j, &mut row);
                for i in 0..m {
                    let xs = &x[i * k..(i + 1) * k];
                    let exact: f64 = xs
                        .iter()
                        .zip(&row)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum();
                    let scale: f64 = xs
                        .iter()
                        .zip(&row)
                        .map(|(a, b)| (*a as f64 * *b as f64).abs())
                        .sum();
                    let error = (got[i * n + j] as f64 - exact).abs();
                    assert!(error <= 0.01 * scale, "{format}: {error} vs scale {scale}");
                }
            }
        }
    }
}
