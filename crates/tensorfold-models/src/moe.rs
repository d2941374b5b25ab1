//! A routed mixture of experts, row-local: each row's router logits, its
//! softmax and its top-k choice depend on that row alone, and each expert
//! multiplies the rows routed to it through the row-invariant matmuls, so
//! a row's output is the same bits whichever rows share the call.

use crate::plan::{Activation, Experts};
use tensorfold_quant::Matrix;

/// One layer's experts.
pub struct ExpertWeights {
    /// `count x hidden`: a row's logit for each expert.
    pub router: Matrix,
    pub gate: Vec<Matrix>,
    pub up: Vec<Matrix>,
    pub down: Vec<Matrix>,
}

impl ExpertWeights {
    pub fn bytes(&self) -> usize {
        self.router.bytes()
            + [&self.gate, &self.up, &self.down]
                .iter()
                .flat_map(|m| m.iter())
                .map(Matrix::bytes)
                .sum::<usize>()
    }

    /// Bytes one token reads: the router and `used` experts.
    pub fn bytes_per_token(&self, used: usize) -> usize {
        let expert = self.gate[0].bytes() + self.up[0].bytes() + self.down[0].bytes();
        self.router.bytes() + used * expert
    }
}

/// `act(gate) * up`, in place in `gate`.
pub(crate) fn gated(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        // Attention's polynomial `exp`: it inlines and the loop vectorizes
        // (libm's `expf` is a call a value).
        Activation::Silu => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, u)| *g = *g / (1.0 + crate::attention::exp(-*g)) * *u),
        Activation::GeluTanh => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, u)| *g = gelu_tanh(*g) * *u),
    }
}

/// GELU, tanh approximation.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// A row's chosen experts and their weights, best first (ties to the
/// lower index): the softmax over every expert's logit, the top `used`,
/// renormalized when the plan says so. A function of the row's logits
/// alone; every backend routes with it. The choice ranks the logits
/// themselves: the softmax keeps their order, and ranking its rounded
/// values would turn two close logits into a tie.
pub fn route_experts(e: &Experts, logits: &[f32]) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = exps.iter().map(|&x| x as f64).sum();
    let inverse = (1.0 / sum) as f32;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut chosen: Vec<(usize, f32)> = order[..e.used]
        .iter()
        .map(|&i| (i, exps[i] * inverse))
        .collect();
    if e.norm_top_k {
        let total: f32 = chosen.iter().map(|(_, w)| w).sum();
        chosen.iter_mut().for_each(|(_, w)| *w /= total);
    }
    chosen
}

/// The mixture's output for `m` rows of `xn` (each `hidden` wide), written
/// to `out`: per row, its experts' outputs times their weights, summed in
/// the order of the choice.
pub(crate) fn mixture(
    e: &Experts,
    w: &ExpertWeights,
    act: Activation,
    xn: &[f32],
    m: usize,
    out: &mut [f32],
) {
    let h = xn.len() / m;
    let mut logits = vec![0f32; m * e.count];
    w.router.matmul(xn, m, &mut logits);
    let routes: Vec<Vec<(usize, f32)>> = logits
        .chunks_exact(e.count)
        .map(|l| route_experts(e, l))
        .collect();

    // Each (row, slot)'s weighted expert output.
    let mut slots = vec![0f32; m * e.used * h];
    for expert in 0..e.count {
        let taken: Vec<(usize, usize, f32)> = routes
            .iter()
            .enumerate()
            .flat_map(|(row, r)| {
                r.iter()
                    .enumerate()
                    .filter(|(_, (x, _))| *x == expert)
                    .map(move |(slot, (_, weight))| (row, slot, *weight))
            })
            .collect();
        if taken.is_empty() {
            continue;
        }
        let n = taken.len();
        let mut rows = Vec::with_capacity(n * h);
        for &(row, _, _) in &taken {
            rows.extend_from_slice(&xn[row * h..(row + 1) * h]);
        }
        let mut gate = vec![0f32; n * e.ff];
        let mut up = vec![0f32; n * e.ff];
        Matrix::matmul_each(
            &[&w.gate[expert], &w.up[expert]],
            &rows,
            n,
            &mut [&mut gate, &mut up],
        );
        gated(act, &mut gate, &up);
        let mut down = vec![0f32; n * h];
        w.down[expert].matmul(&gate, n, &mut down);
        for (&(row, slot, weight), y) in taken.iter().zip(down.chunks_exact(h)) {
            let at = &mut slots[(row * e.used + slot) * h..][..h];
            at.iter_mut().zip(y).for_each(|(a, y)| *a = y * weight);
        }
    }
    for (row, o) in out.chunks_exact_mut(h).enumerate() {
        let mine = &slots[row * e.used * h..][..e.used * h];
        o.copy_from_slice(&mine[..h]);
        for s in mine.chunks_exact(h).skip(1) {
            o.iter_mut().zip(s).for_each(|(o, s)| *o += *s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two logits whose softmax values round to one float: the larger
    /// logit still comes first.
    #[test]
    fn routing_ranks_logits_not_their_rounded_softmax() {
        let e = Experts {
            count: 2,
            used: 1,
            ff: 1,
            norm_top_k: false,
        };
        let logits = [0.0, 1e-8];
        assert_eq!((-1e-8f32).exp(), 1.0, "the softmax cannot tell them apart");
        assert_eq!(route_experts(&e, &logits)[0].0, 1);
    }

    #[test]
    fn routing_keeps_the_top_k_renormalized() {
        let e = Experts {
            count: 4,
            used: 2,
            ff: 1,
            norm_top_k: true,
        };
        let r = route_experts(&e, &[0.0, 2.0, 1.0, 2.0]);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3]);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
    }
}
