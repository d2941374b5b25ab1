//! A routed mixture of experts on the device. The router's product runs
//! on the device; its logits come to the host, which routes each row with
//! [`route_experts`] (the CPU forward's rule, a function of the row
//! alone); each expert then multiplies the rows routed to it, gathered
//! into consecutive rows, through the row-invariant matmuls, and a row's
//! weighted slots are summed in slot order (`kernels/cuda/experts.cu`).
//! So a row's output does not depend on which rows share the call. The
//! host's routing waits for the router, so these forwards are not captured
//! as graphs.

use super::{half_words, CudaModel, DevMatrix, Linear, Out};
use crate::launch::{opt_ptr, ptr, Launch};
use crate::Result;
use cudarc::driver::{CudaSlice, LaunchConfig};
use tensorfold_models::{route_experts, Experts};

/// One layer's experts in device memory.
pub(super) struct DevExperts {
    pub(super) router: DevMatrix,
    /// Each expert's gate | up.
    pub(super) gate_up: Vec<Linear>,
    pub(super) down: Vec<DevMatrix>,
}

/// Buffers of a mixture, grown to the largest call seen.
#[derive(Default)]
pub(super) struct ExpertScratch {
    rows: usize,
    bufs: Option<ExpertBufs>,
}

struct ExpertBufs {
    /// Router logits, `rows x count`.
    logits: CudaSlice<f32>,
    /// The rows routed to one expert, gathered (and their f16 copy).
    x: CudaSlice<f32>,
    x16: Option<CudaSlice<u32>>,
    gate_up: CudaSlice<f32>,
    act: CudaSlice<f32>,
    act16: Option<CudaSlice<u32>>,
    /// One expert's output rows.
    y: CudaSlice<f32>,
    /// Every (row, slot)'s weighted output, `rows x used x hidden`.
    slots: CudaSlice<f32>,
    /// Gathered row indices, then their slots, expert after expert.
    table: CudaSlice<i64>,
    /// Each (row, slot)'s routing weight.
    weights: CudaSlice<f32>,
}

/// Where each expert's rows sit in the table of one call.
struct Routing {
    /// Gathered rows (expert after expert), then their slots
    /// (`row * used + k`).
    table: Vec<i64>,
    weights: Vec<f32>,
    /// `(expert, first entry, rows)` for each expert with rows.
    runs: Vec<(usize, usize, usize)>,
}

/// Routes every row of `logits` (`count` per row) and groups the rows by
/// expert, in row order within each.
fn routing(e: &Experts, logits: &[f32]) -> Routing {
    let routes: Vec<Vec<(usize, f32)>> = logits
        .chunks_exact(e.count)
        .map(|l| route_experts(e, l))
        .collect();
    let mut weights = vec![0f32; routes.len() * e.used];
    let mut by_expert: Vec<Vec<(i64, i64)>> = vec![Vec::new(); e.count];
    for (row, chosen) in routes.iter().enumerate() {
        for (k, &(expert, weight)) in chosen.iter().enumerate() {
            let slot = row * e.used + k;
            weights[slot] = weight;
            by_expert[expert].push((row as i64, slot as i64));
        }
    }
    let entries = routes.len() * e.used;
    let mut table = vec![0i64; 2 * entries];
    let mut runs = Vec::new();
    let mut at = 0;
    for (expert, taken) in by_expert.iter().enumerate() {
        if taken.is_empty() {
            continue;
        }
        runs.push((expert, at, taken.len()));
        for &(row, slot) in taken {
            table[at] = row;
            table[entries + at] = slot;
            at += 1;
        }
    }
    Routing {
        table,
        weights,
        runs,
    }
}

fn rows_config(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaModel {
    /// Room for a mixture over `m` rows.
    fn ensure_experts(&self, s: &mut ExpertScratch, e: &Experts, m: usize) -> Result<()> {
        if s.bufs.is_some() && m <= s.rows {
            return Ok(());
        }
        let h = self.config.hidden_size;
        let st = &self.stream;
        let half_words = |rows, width| half_words(st, rows, width);
        let rows = m.max(s.rows);
        s.bufs = None;
        s.bufs = Some(ExpertBufs {
            logits: st.alloc_zeros(rows * e.count)?,
            x: st.alloc_zeros(rows * h)?,
            x16: half_words(rows, h)?,
            gate_up: st.alloc_zeros(rows * 2 * e.ff)?,
            act: st.alloc_zeros(rows * e.ff)?,
            act16: half_words(rows, e.ff)?,
            y: st.alloc_zeros(rows * h)?,
            slots: st.alloc_zeros(rows * e.used * h)?,
            table: st.alloc_zeros(2 * rows * e.used)?,
            weights: st.alloc_zeros(rows * e.used)?,
        });
        s.rows = rows;
        Ok(())
    }

    /// `x += ` the mixture of `experts` over the `m` normalized rows `xn`
    /// (`xn16` their f16 copy, or 0).
    pub(super) fn mixture(
        &self,
        experts: &DevExperts,
        xn: u64,
        xn16: u64,
        x: u64,
        m: usize,
    ) -> Result<()> {
        let c = &self.config;
        let e = c.plan.experts.expect("a block of experts has the plan's");
        let h = c.hidden_size;
        let st = &self.stream;
        let mut guard = self.experts.lock().expect("experts lock");
        self.ensure_experts(&mut guard, &e, m)?;
        let b = guard.bufs.as_mut().expect("expert buffers");

        let logits = ptr(&b.logits, st);
        self.matmul(&experts.router, xn, xn16, logits, m, e.count, Out::Set)?;
        let mut host = vec![0f32; m * e.count];
        st.memcpy_dtoh(&b.logits.slice(..m * e.count), &mut host)?;
        st.synchronize()?;
        let route = routing(&e, &host);
        st.memcpy_htod(&route.table, &mut b.table)?;
        st.memcpy_htod(&route.weights, &mut b.weights)?;

        let entries = (m * e.used) as u64;
        let (table, weights) = (ptr(&b.table, st), ptr(&b.weights, st));
        let (gx, gx16) = (ptr(&b.x, st), opt_ptr(&b.x16, st));
        let (gate_up, act, act16) = (ptr(&b.gate_up, st), ptr(&b.act, st), opt_ptr(&b.act16, st));
        let (y, slots) = (ptr(&b.y, st), ptr(&b.slots, st));
        let (hi, usedi) = (h as i32, e.used as i32);
        for &(expert, first, n) in &route.runs {
            let rows = table + 8 * first as u64;
            let row_slots = table + 8 * (entries + first as u64);
            let mut lb = Launch::new(&self.k.gather_rows);
            lb.arg(&xn).arg(&rows).arg(&gx).arg(&gx16).arg(&hi);
            // SAFETY: matches `gather_rows` in experts.cu; the table's `n`
            // entries from `first` are rows of `xn` (below `m`), and `x`
            // (and `x16`, unless 0, with `h` a multiple of 32) hold `m` rows.
            unsafe { lb.launch(st, rows_config(n), self.k.early) }?;
            self.mark(|| "gather rows".into())?;

            self.linear(&experts.gate_up[expert], gx, gx16, gate_up, n)?;
            self.gated_mul(gate_up, act, act16, n, e.ff)?;
            self.matmul(&experts.down[expert], act, act16, y, n, h, Out::Set)?;
            let mut lb = Launch::new(&self.k.scatter_weighted);
            lb.arg(&y)
                .arg(&row_slots)
                .arg(&weights)
                .arg(&slots)
                .arg(&hi);
            // SAFETY: matches `scatter_weighted`; the `n` slots are below
            // `m * used`, the rows of `slots` and of `weights`.
            unsafe { lb.launch(st, rows_config(n), self.k.early) }?;
            self.mark(|| "scatter weighted".into())?;
        }
        let mut lb = Launch::new(&self.k.add_slots);
        lb.arg(&x).arg(&slots).arg(&usedi).arg(&hi);
        // SAFETY: matches `add_slots`; every row routes to `used` distinct
        // experts, so each of its slots was written above; `x` holds `m`
        // rows.
        unsafe { lb.launch(st, rows_config(m), self.k.early) }?;
        self.mark(|| "add slots".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_grouped_by_expert_in_row_order() {
        let e = Experts {
            count: 3,
            used: 2,
            ff: 1,
            norm_top_k: false,
        };
        // Row 0 picks experts 2 then 0; row 1 picks 0 then 1.
        let logits = [1.0, -5.0, 3.0, 2.0, 1.0, -5.0];
        let r = routing(&e, &logits);
        assert_eq!(r.runs, [(0, 0, 2), (1, 2, 1), (2, 3, 1)]);
        // Rows, then their slots (row * used + k).
        assert_eq!(r.table, [0, 1, 1, 0, 1, 2, 3, 0]);
        assert!(r.weights.iter().all(|w| *w > 0.0));
    }
}
