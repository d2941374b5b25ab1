//! The process's memory budget and what it is spent on.
//!
//! Fixed costs (weights, the resident runtime, the forward's workspace)
//! come off the top; what remains holds key/value caches. A stream is
//! admitted only when its whole cache (prompt plus every reply position it
//! may reach) fits next to the caches already reserved, so the total never
//! passes the limit however the streams grow.

use std::fmt;

/// Share of the machine's memory the process may use unless told otherwise.
pub const DEFAULT_FRACTION: f64 = 0.7;

/// Environment variable that replaces the default limit, in GiB.
pub const LIMIT_ENV: &str = "TENSORFOLD_MEMORY_LIMIT_GB";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BudgetError {
    #[error("{LIMIT_ENV}={0:?} is not a positive number of GiB")]
    BadLimit(String),
    #[error("the memory budget of {limit} cannot hold the fixed costs of {fixed} (weights, runtime, workspace)")]
    FixedCosts { limit: Bytes, fixed: Bytes },
    #[error("a context of {asked} tokens does not fit the memory budget of {limit}; at most {fits} tokens fit")]
    Context {
        asked: usize,
        fits: usize,
        limit: Bytes,
    },
}

/// A byte count printed in GiB or MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0 as f64;
        if b >= (1u64 << 30) as f64 {
            write!(f, "{:.2} GiB", b / (1u64 << 30) as f64)
        } else {
            write!(f, "{:.1} MiB", b / (1u64 << 20) as f64)
        }
    }
}

/// The limit: `TENSORFOLD_MEMORY_LIMIT_GB` if set, else 70% of the
/// machine's (or the cgroup's, when smaller) memory.
pub fn process_limit() -> Result<usize, BudgetError> {
    limit_of(machine_memory())
}

/// The limit for a device with `total` bytes of its own memory (a GPU):
/// `TENSORFOLD_MEMORY_LIMIT_GB` if set, else 70% of `total`.
pub fn limit_of(total: usize) -> Result<usize, BudgetError> {
    match std::env::var(LIMIT_ENV) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
            Ok(gb) if gb > 0.0 && gb.is_finite() => Ok((gb * (1u64 << 30) as f64) as usize),
            _ => Err(BudgetError::BadLimit(v)),
        },
        _ => Ok((total as f64 * DEFAULT_FRACTION) as usize),
    }
}

/// Physical memory, bounded by a cgroup v2 limit if one is set.
pub fn machine_memory() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        })
        .map_or(8 << 30, |kib| kib * 1024);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    cgroup.map_or(total, |c| c.min(total))
}

/// Resident memory of this process now, and its peak (Linux; 0 elsewhere).
pub fn resident() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// How the budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Everything the process may hold.
    pub limit: usize,
    /// Weights, runtime and forward workspace: paid once.
    pub fixed: usize,
    /// Cache bytes per position of one stream (target and draft model).
    pub per_position: usize,
}

impl MemoryBudget {
    /// Bytes left for caches.
    pub fn for_caches(&self) -> usize {
        self.limit.saturating_sub(self.fixed)
    }

    /// Positions one stream's cache may hold: the largest window that fits.
    pub fn positions(&self) -> usize {
        self.for_caches() / self.per_position.max(1)
    }

    /// Bytes a stream of `positions` reserves, growth slack included.
    pub fn stream_bytes(&self, positions: usize) -> usize {
        (positions + tensorfold_kv::GROWTH) * self.per_position
    }

    /// The context window: `asked`, or the largest that fits, capped by the
    /// model's own window. Refuses an `asked` window that cannot fit.
    pub fn window(&self, asked: Option<usize>, model_max: usize) -> Result<usize, BudgetError> {
        if self.fixed >= self.limit {
            return Err(BudgetError::FixedCosts {
                limit: Bytes(self.limit),
                fixed: Bytes(self.fixed),
            });
        }
        let fits = self
            .positions()
            .saturating_sub(tensorfold_kv::GROWTH)
            .min(model_max);
        match asked {
            Some(a) if a > fits => Err(BudgetError::Context {
                asked: a,
                fits,
                limit: Bytes(self.limit),
            }),
            Some(a) => Ok(a),
            None if fits < 2 => Err(BudgetError::Context {
                asked: 2,
                fits,
                limit: Bytes(self.limit),
            }),
            None => Ok(fits),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: usize) -> MemoryBudget {
        MemoryBudget {
            limit,
            fixed: 1000,
            per_position: 10,
        }
    }

    #[test]
    fn an_omitted_window_is_the_largest_that_fits_capped_by_the_model() {
        let b = budget(1000 + 10 * (500 + tensorfold_kv::GROWTH));
        assert_eq!(b.window(None, 4096), Ok(500));
        assert_eq!(b.window(None, 300), Ok(300));
        assert!(b.stream_bytes(500) <= b.for_caches());
    }

    #[test]
    fn a_window_that_cannot_fit_is_refused_with_what_would() {
        let b = budget(1000 + 10 * (500 + tensorfold_kv::GROWTH));
        let err = b.window(Some(501), 4096).unwrap_err();
        assert!(matches!(err, BudgetError::Context { fits: 500, .. }));
        assert!(err.to_string().contains("at most 500 tokens"), "{err}");
        assert_eq!(b.window(Some(500), 4096), Ok(500));
    }

    #[test]
    fn fixed_costs_past_the_limit_are_refused() {
        assert!(matches!(
            budget(999).window(None, 10),
            Err(BudgetError::FixedCosts { .. })
        ));
    }
}
