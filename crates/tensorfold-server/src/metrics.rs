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
    /// Tokens generated so far, live (for the throughput line): a running
    /// stream counts its text pieces (one a token, but for text held back
    /// at a stop-string prefix or a split character), and each finished
    /// stream is settled to its exact token count.
    pub completion_tokens_live: AtomicU64,
    pub drafted: AtomicU64,
    pub accepted: AtomicU64,
    pub rounds: AtomicU64,
    /// Shared rounds the worker ran (each one forward for every live stream).
    pub steps: AtomicU64,
    /// Live streams summed over those rounds (over `steps`: the mean batch).
    pub step_streams: AtomicU64,
    /// Microseconds spent in those rounds (the rest of the time the worker
    /// waited for work or admitted it).
    pub step_micros: AtomicU64,
    pub queued: AtomicU64,
    pub running: AtomicU64,
    /// Prompt tokens taken from retained states instead of prefilled.
    pub cached_tokens: AtomicU64,
    /// Requests finished (not cancelled).
    pub finished: AtomicU64,
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
        self.cached_tokens
            .fetch_add(c.cached_tokens as u64, Ordering::Relaxed);
        if c.finish_reason == tensorfold_engine::FinishReason::Cancelled {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        } else {
            self.finished.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Replaces a finished stream's `pieces` in the live count by its exact
    /// `tokens`.
    pub fn settle_live(&self, pieces: Option<&AtomicU64>, tokens: usize) {
        let pieces = pieces.map_or(0, |p| p.load(Ordering::Relaxed));
        self.completion_tokens_live
            .fetch_add(tokens as u64, Ordering::Relaxed);
        self.completion_tokens_live
            .fetch_sub(pieces, Ordering::Relaxed);
    }

    /// The same counters under the names vLLM exports, labelled with the
    /// model as vLLM labels them, so dashboards built for vLLM work.
    pub fn render_vllm(&self, model: &str) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                g(&self.running),
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                g(&self.queued),
            ),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                g(&self.prompt_tokens),
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                g(&self.completion_tokens),
            ),
            (
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                g(&self.finished),
            ),
            (
                "vllm:spec_decode_num_drafts_total",
                "counter",
                "Number of verification rounds.",
                g(&self.rounds),
            ),
            (
                "vllm:spec_decode_num_draft_tokens_total",
                "counter",
                "Number of draft tokens.",
                g(&self.drafted),
            ),
            (
                "vllm:spec_decode_num_accepted_tokens_total",
                "counter",
                "Number of accepted tokens.",
                g(&self.accepted),
            ),
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                g(&self.prompt_tokens),
            ),
            (
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                g(&self.cached_tokens),
            ),
        ];
        // Label values escape backslash, quote and newline (text format 0.0.4).
        let model = model
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{model_name=\"{model}\"}} {value}\n"
            ));
        }
        out
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
                "tensorfold_steps_total",
                "counter",
                "Shared rounds run, each one forward for every live stream.",
                g(&self.steps),
            ),
            (
                "tensorfold_step_streams_total",
                "counter",
                "Live streams summed over the shared rounds (divided by the rounds: the mean batch).",
                g(&self.step_streams),
            ),
            (
                "tensorfold_step_microseconds_total",
                "counter",
                "Time spent in shared rounds.",
                g(&self.step_micros),
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
