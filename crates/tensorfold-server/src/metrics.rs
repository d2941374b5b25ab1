//! Counters for `GET /metrics` (Prometheus text format).

use std::sync::atomic::{AtomicU64, Ordering};
use tensorfold_engine::Completion;

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Text deltas streamed so far (for the live throughput line).
    pub completion_tokens_live: AtomicU64,
    pub drafted: AtomicU64,
    pub accepted: AtomicU64,
    pub rounds: AtomicU64,
    pub queued: AtomicU64,
    pub running: AtomicU64,
    /// Rounds that failed (a panic or a device error); their streams ended.
    pub faults: AtomicU64,
    /// Cache bytes the live streams reserved (0 when idle).
    pub reserved_bytes: AtomicU64,
    /// Bytes of retained prompt states.
    pub retained_bytes: AtomicU64,
}

/// Resident memory of this process in bytes (Linux), 0 elsewhere.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

impl Metrics {
    pub fn record(&self, c: &Completion) {
        self.prompt_tokens
            .fetch_add(c.prompt_tokens as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(c.completion_tokens as u64, Ordering::Relaxed);
        self.drafted
            .fetch_add(c.draft.drafted as u64, Ordering::Relaxed);
        self.accepted
            .fetch_add(c.draft.accepted as u64, Ordering::Relaxed);
        self.rounds
            .fetch_add(c.draft.rounds as u64, Ordering::Relaxed);
        if c.finish_reason == tensorfold_engine::FinishReason::Cancelled {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows = [
            (
                "tensorfold_requests_total",
                "counter",
                "Requests received.",
                g(&self.requests),
            ),
            (
                "tensorfold_request_errors_total",
                "counter",
                "Requests answered with an error.",
                g(&self.errors),
            ),
            (
                "tensorfold_requests_cancelled_total",
                "counter",
                "Requests whose client went away.",
                g(&self.cancelled),
            ),
            (
                "tensorfold_prompt_tokens_total",
                "counter",
                "Prompt tokens processed.",
                g(&self.prompt_tokens),
            ),
            (
                "tensorfold_completion_tokens_total",
                "counter",
                "Tokens generated.",
                g(&self.completion_tokens),
            ),
            (
                "tensorfold_draft_tokens_total",
                "counter",
                "Draft tokens verified.",
                g(&self.drafted),
            ),
            (
                "tensorfold_draft_accepted_total",
                "counter",
                "Draft tokens accepted.",
                g(&self.accepted),
            ),
            (
                "tensorfold_rounds_total",
                "counter",
                "Verification rounds.",
                g(&self.rounds),
            ),
            (
                "tensorfold_queue_depth",
                "gauge",
                "Requests waiting.",
                g(&self.queued),
            ),
            (
                "tensorfold_running",
                "gauge",
                "Requests generating.",
                g(&self.running),
            ),
            (
                "tensorfold_round_faults_total",
                "counter",
                "Rounds that failed; their streams ended with an error.",
                g(&self.faults),
            ),
            (
                "tensorfold_reserved_cache_bytes",
                "gauge",
                "Cache bytes reserved by the running requests.",
                g(&self.reserved_bytes),
            ),
            (
                "tensorfold_retained_prompt_bytes",
                "gauge",
                "Bytes of retained prompt states.",
                g(&self.retained_bytes),
            ),
            (
                "tensorfold_resident_memory_bytes",
                "gauge",
                "Resident memory of the process.",
                rss_bytes(),
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        out
    }
}
