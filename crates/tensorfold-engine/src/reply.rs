//! A reply being built: tokens arrive one at a time, in order, and the
//! first that ends it (EOS, stop string, budget, cancel) sets its finish.

use crate::engine::{Completion, Engine, FinishReason, GenerateRequest, TokenLogprob};
use crate::grammar::Constraint;
use crate::sampling::Sampler;
use crate::text::TextStream;
use std::cell::RefCell;
use std::time::Duration;
use tensorfold_scheduler::Client;
use tensorfold_spec::DraftStats;

/// How a stream went, as the scheduler reports it.
pub(crate) struct Outcome {
    pub cancelled: bool,
    pub draft: DraftStats,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    pub cached_tokens: usize,
}

/// Receives each text delta; returns `false` to cancel.
pub type OnText<'a> = Box<dyn FnMut(&str) -> bool + 'a>;

pub(crate) struct Reply<'a> {
    engine: &'a Engine,
    req: GenerateRequest,
    sampler: Sampler,
    /// The request's grammar, masking every row (picks take `&self`).
    constraint: Option<RefCell<Constraint>>,
    /// The drafts this round verifies after the accepted tokens.
    in_flight: Vec<u32>,
    text: TextStream,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    prompt_tokens: usize,
    budget: usize,
    finish: Option<FinishReason>,
    on_text: OnText<'a>,
}

impl<'a> Reply<'a> {
    pub(crate) fn new(
        engine: &'a Engine,
        req: GenerateRequest,
        prompt: &[u32],
        budget: usize,
        on_text: OnText<'a>,
    ) -> Reply<'a> {
        Reply {
            engine,
            sampler: Sampler::new(req.sampling.clone(), prompt),
            constraint: req
                .grammar
                .as_ref()
                .map(|g| RefCell::new(Constraint::new(g, &engine.bundle().eos_ids))),
            in_flight: Vec::new(),
            text: TextStream::new(req.stop.clone()),
            req,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            prompt_tokens: prompt.len(),
            budget,
            finish: None,
            on_text,
        }
    }

    /// Whether the request lets its state be retained and reused.
    pub(crate) fn caches_prompt(&self) -> bool {
        self.req.cache_prompt
    }

    /// The completion of a stream that left the scheduler.
    pub(crate) fn complete(self, done: &Outcome) -> Completion {
        let mut reply = self;
        let finish = match reply.finish {
            _ if done.cancelled => FinishReason::Cancelled,
            Some(f) => f,
            None => FinishReason::Length,
        };
        if finish != FinishReason::Cancelled {
            let rest = reply.text.finish();
            if !rest.is_empty() {
                (reply.on_text)(&rest);
            }
        }
        Completion {
            text: reply.text.text().to_string(),
            completion_tokens: reply.tokens.len(),
            tokens: reply.tokens,
            prompt_tokens: reply.prompt_tokens,
            cached_tokens: done.cached_tokens,
            finish_reason: finish,
            draft: done.draft,
            logprobs: reply.logprobs,
            prefill_time: done.prefill_time,
            decode_time: done.decode_time,
        }
    }
}

impl Client for Reply<'_> {
    fn pick(&self, position: usize, row: &[f32]) -> u32 {
        // The accepted tokens and the drafts between them and this row: the
        // reply before it, as serial decode would have accepted it.
        let drafted = position.saturating_sub(self.prompt_tokens + self.tokens.len());
        let drafted = drafted.min(self.in_flight.len());
        let budget = self.req.thinking_budget.as_ref();
        if let Some(budget) = budget.filter(|b| b.covers(self.tokens.len() + drafted)) {
            let before: Vec<u32> = self
                .tokens
                .iter()
                .chain(&self.in_flight[..drafted])
                .copied()
                .collect();
            if let Some(t) = budget.forced(self.engine, &before) {
                return t;
            }
        }
        let Some(constraint) = &self.constraint else {
            return self.sampler.pick(position, row);
        };
        let mut constraint = constraint.borrow_mut();
        let mask = constraint.mask(drafted);
        let masked = constraint.apply(mask.as_ref(), row);
        self.sampler.pick(position, &masked)
    }

    fn draw(&self, rows: usize) -> Option<tensorfold_sampling::Draw> {
        // A grammar masks rows and log-probabilities read them; a thinking
        // budget may force the tokens of the reply indices it covers.
        if self.constraint.is_some() || self.req.logprobs.is_some() {
            return None;
        }
        let first = self.tokens.len();
        if let Some(budget) = &self.req.thinking_budget {
            if (first..first + rows).any(|k| budget.covers(k)) {
                return None;
            }
        }
        Some(self.sampler.draw())
    }

    fn drafts(&mut self, drafts: Vec<u32>) -> Vec<u32> {
        let drafts = match &self.constraint {
            Some(c) => c.borrow_mut().cut_drafts(drafts),
            None => drafts,
        };
        self.in_flight.clone_from(&drafts);
        drafts
    }

    fn accept(&mut self, token: u32, row: Option<&[f32]>) -> bool {
        if self.finish.is_some() {
            return false;
        }
        if self.tokens.len() >= self.budget {
            self.finish = Some(FinishReason::Length);
            return false;
        }
        if !self.req.ignore_eos && self.engine.bundle().eos_ids.contains(&token) {
            self.finish = Some(FinishReason::Stop);
            return false;
        }
        self.tokens.push(token);
        if let Some(c) = &self.constraint {
            c.borrow_mut().accept(token);
        }
        // A request for log-probabilities never lets its rows stay on the
        // device (`draw`), so its row is here.
        if let (Some(n), Some(row)) = (self.req.logprobs, row) {
            self.logprobs.push(token_logprob(row, token, n));
        }
        let delta = self.text.push(&self.engine.bundle().tokenizer, token);
        if !delta.text.is_empty() && !(self.on_text)(&delta.text) {
            self.finish = Some(FinishReason::Cancelled);
        } else if delta.stopped {
            self.finish = Some(FinishReason::Stop);
        } else if self.tokens.len() >= self.budget {
            self.finish = Some(FinishReason::Length);
        }
        self.finish.is_none()
    }
}

/// Log-softmax of `row` at `token`, and the `n` most likely tokens.
fn token_logprob(row: &[f32], token: u32, n: usize) -> TokenLogprob {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = |t: u32| (row[t as usize] as f64 - lse) as f32;
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    let n = n.min(ids.len());
    if n > 0 {
        ids.select_nth_unstable_by(n - 1, |&a, &b| {
            row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
        });
    }
    let mut top: Vec<(u32, f32)> = ids[..n].iter().map(|&t| (t, lp(t))).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    TokenLogprob {
        token,
        logprob: lp(token),
        top,
    }
}
