//! The one summation order of the rule, tied to the vocabulary size alone:
//! value `j` goes to lane `j % LANES`, each lane adds its values in
//! increasing `j` from `+0.0`, then lanes fold pairwise by halves (lane `c`
//! takes lane `c + h` for h = 512, 256, ..., 1). A GPU block of `LANES`
//! threads computes exactly this; so does the CPU. Every value is `>= 0`,
//! so a value left out and a `0.0` added give the same bits.

/// Lanes of the fixed-order sum (a power of two).
pub const LANES: usize = 1024;

fn fold(lanes: &mut [f64; LANES]) -> f64 {
    let mut h = LANES / 2;
    while h > 0 {
        for c in 0..h {
            lanes[c] += lanes[c + h];
        }
        h /= 2;
    }
    lanes[0]
}

/// The rule's sum of `(id, value)` pairs, given in increasing id.
pub fn sum(values: impl IntoIterator<Item = (u32, f64)>) -> f64 {
    let mut lanes = [0.0; LANES];
    for (id, v) in values {
        lanes[id as usize % LANES] += v;
    }
    fold(&mut lanes)
}

/// The same sum over a set that grows one id at a time, in any order of
/// ids: each addition recomputes its lane and that lane's path to the top.
pub struct GrowingSum {
    values: Vec<f64>,
    /// `levels[0]` holds the lanes, `levels[d]` the folds after d halvings.
    levels: Vec<Vec<f64>>,
}

impl GrowingSum {
    pub fn new(vocab: usize) -> GrowingSum {
        let mut levels = Vec::new();
        let mut width = LANES;
        while width > 0 {
            levels.push(vec![0.0; width]);
            width /= 2;
        }
        GrowingSum {
            values: vec![0.0; vocab],
            levels,
        }
    }

    pub fn add(&mut self, id: u32, value: f64) {
        let id = id as usize;
        self.values[id] = value;
        let lane = id % LANES;
        self.levels[0][lane] = self.values[lane..].iter().step_by(LANES).sum_ordered();
        for d in 1..self.levels.len() {
            let h = LANES >> d;
            let i = lane % h;
            self.levels[d][i] = self.levels[d - 1][i] + self.levels[d - 1][i + h];
        }
    }

    pub fn total(&self) -> f64 {
        self.levels[self.levels.len() - 1][0]
    }
}

/// A left-to-right sum from `+0.0` (the lanes' order).
trait SumOrdered {
    fn sum_ordered(self) -> f64;
}

impl<'a, I: Iterator<Item = &'a f64>> SumOrdered for I {
    fn sum_ordered(self) -> f64 {
        self.fold(0.0, |acc, &v| acc + v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_growing_sum_is_the_sum_of_its_set() {
        let vocab = 5000;
        let value = |id: u32| 1.0 / (1.0 + id as f64 * 0.37);
        let mut growing = GrowingSum::new(vocab);
        let mut ids: Vec<u32> = (0..vocab as u32).filter(|i| i % 3 != 1).collect();
        ids.reverse();
        ids.rotate_left(700);
        let mut added = Vec::new();
        for (n, &id) in ids.iter().enumerate() {
            growing.add(id, value(id));
            added.push(id);
            if n % 97 == 0 || n + 1 == ids.len() {
                let mut sorted = added.clone();
                sorted.sort_unstable();
                let whole = sum(sorted.iter().map(|&i| (i, value(i))));
                assert_eq!(growing.total().to_bits(), whole.to_bits(), "after {n}");
            }
        }
    }
}
