//! Continuous batching with exact drafting.
//!
//! Every live stream puts its rows into one shared forward per round: a
//! decoding stream its pending token and its drafts, a prefilling stream
//! the next chunk of its prompt. Streams join and leave between rounds.
//! Each keeps its own cache, sampler (behind [`Client`]) and drafter, and
//! because the model's arithmetic for a row does not depend on the other
//! rows of the call, each stream's tokens are those it would get alone.
//!
//! A stream whose picks are the sampling rule's alone this round (no
//! grammar, no forced token, no log-probabilities: [`Client::draw`]) lets
//! the forward pick its rows where the logits are ([`PickingForward`]);
//! the rule gives the same token on every device, so where its rows are
//! picked never changes its tokens.
//!
//! ```
//! use tensorfold_kv::KvCache;
//! use tensorfold_models::synth::{self, SynthSpec};
//! use tensorfold_models::{Arch, Format};
//! use tensorfold_scheduler::{Client, Scheduler};
//!
//! /// Greedy, collecting tokens.
//! struct Greedy(Vec<u32>);
//! impl Client for Greedy {
//!     fn pick(&self, _position: usize, row: &[f32]) -> u32 {
//!         (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
//!     }
//!     fn accept(&mut self, token: u32, _row: Option<&[f32]>) -> bool {
//!         self.0.push(token);
//!         true
//!     }
//! }
//!
//! let path = std::env::temp_dir().join(format!("scheduler-doc-{}.gguf", std::process::id()));
//! synth::write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::F32, 7)).unwrap();
//! let model = tensorfold_models::load(&path).unwrap().model;
//! let shape = model.config.kv_shape();
//! let mut scheduler = Scheduler::new(0.5);
//! scheduler.admit(Greedy(Vec::new()), vec![1, 2, 3], 5, None, KvCache::new(shape));
//! scheduler.admit(Greedy(Vec::new()), vec![4, 5], 3, None, KvCache::new(shape));
//! let mut done = Vec::new();
//! while !scheduler.is_empty() {
//!     done.extend(scheduler.round(&model));
//! }
//! done.sort_by_key(|f| f.id);
//! assert_eq!(done[0].client.0.len(), 5);
//! assert_eq!(done[1].client.0.len(), 3);
//! # std::fs::remove_file(&path).unwrap();
//! ```

pub mod memory;

use std::time::{Duration, Instant};
use tensorfold_forward::{Cache, ForwardError, Logits, Seq};
use tensorfold_kv::KvCache;
use tensorfold_sampling::{Draw, SeqRows};
use tensorfold_spec::{accept, DraftStats, Drafter};

/// What a stream's owner decides: which token a row gives, and what to do
/// with each token in order.
pub trait Client {
    /// The token at absolute `position` given that row's logits.
    fn pick(&self, position: usize, row: &[f32]) -> u32;
    /// Takes the next token, picked from `row` (`None` where the forward
    /// picked it by [`Client::draw`] and the row stayed on the device);
    /// returns whether the stream goes on.
    fn accept(&mut self, token: u32, row: Option<&[f32]>) -> bool;
    /// The sampling rule's draw, when this round's `rows` rows (after the
    /// drafts were set) are picked by it alone: `pick` would return
    /// `tensorfold_sampling::pick(&draw, position, row)` for each of them,
    /// and `accept` needs no row. The forward may then pick them itself.
    fn draw(&self, _rows: usize) -> Option<Draw> {
        None
    }
    /// The drafts a round will verify after the pending token. A client
    /// whose picks are constrained (a grammar) cuts them where they could
    /// never be kept and reads them to pick the rows that follow them.
    fn drafts(&mut self, drafts: Vec<u32>) -> Vec<u32> {
        drafts
    }
}

/// Prompt rows a round may take: bounds the forward's workspace.
pub const PREFILL_CHUNK: usize = 256;

/// Fewest prompt rows a round takes while replies decode, so a prompt
/// arriving under load still makes steady progress.
pub const MIN_PREFILL: usize = 32;

/// Most drafts one stream verifies in a round.
pub const MAX_DEPTH: usize = 8;

// The forward the scheduler drives is defined with the rest of the forward
// interface; named here too, where it was first defined.
pub use tensorfold_forward::PickingForward;

/// A stream's handle, unique within its scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// A stream that left: its owner, and how it went.
pub struct Finished<C, K = KvCache> {
    pub id: StreamId,
    pub client: C,
    /// `true` when [`Scheduler::cancel`] ended it.
    pub cancelled: bool,
    /// Set when the forward failed: every live stream ends with it.
    pub error: Option<ForwardError>,
    pub draft: DraftStats,
    /// Admission to first token.
    pub prefill_time: Duration,
    /// First token to the last.
    pub decode_time: Duration,
    /// The stream's cache, and the tokens whose keys and values it holds
    /// (prompt and reply, as far as they were computed): a prefix any later
    /// prompt that starts with these tokens may reuse.
    pub cache: K,
    pub tokens: Vec<u32>,
}

struct Stream<C, K> {
    id: StreamId,
    client: C,
    prompt: Vec<u32>,
    /// Prompt tokens in the cache.
    prefilled: usize,
    cache: K,
    /// Prompt and reply so far: what drafters read.
    context: Vec<u32>,
    /// A token already accepted but not yet in the cache.
    pending: Option<u32>,
    /// Most reply tokens.
    budget: usize,
    produced: usize,
    drafter: Option<Box<dyn Drafter>>,
    draft: DraftStats,
    admitted: Instant,
    first_token: Option<Instant>,
    cancelled: bool,
    error: Option<ForwardError>,
}

/// What a stream puts into a round.
enum Rows {
    Idle,
    Prefill(Vec<u32>),
    /// The pending token and the drafts.
    Decode(Vec<u32>),
}

impl Rows {
    fn tokens(&self) -> &[u32] {
        match self {
            Rows::Idle => &[],
            Rows::Prefill(t) | Rows::Decode(t) => t,
        }
    }
}

/// Streams of one model, each with its own cache of type `K`.
pub struct Scheduler<C, K = KvCache> {
    streams: Vec<Stream<C, K>>,
    next_id: u64,
    decode_share: f64,
    /// Fewest prompt rows a round takes while replies decode.
    min_prefill: usize,
    /// Most decode rows (pending tokens and drafts) a round holds.
    decode_rows: usize,
}

impl<C: Client, K: Cache> Scheduler<C, K> {
    /// `decode_share`: the share of a round's rows that decoding replies
    /// keep while prompts prefill (clamped to `0.05..=1.0`); the rest go to
    /// prompt chunks.
    pub fn new(decode_share: f64) -> Scheduler<C, K> {
        Scheduler {
            streams: Vec::new(),
            next_id: 0,
            decode_share: decode_share.clamp(0.05, 1.0),
            min_prefill: MIN_PREFILL,
            decode_rows: usize::MAX,
        }
    }

    /// Rounds hold at most `rows` decode rows: drafts are cut (evenly per
    /// stream) so that every decoding stream's pending token and drafts fit.
    /// A backend whose forward stays cheap only up to some rows (a GPU's
    /// captured small-batch forward) sets it; drafting cannot then slow a
    /// full batch. Unlimited unless set.
    pub fn with_decode_rows(mut self, rows: usize) -> Scheduler<C, K> {
        self.decode_rows = rows.max(1);
        self
    }

    /// Rounds give waiting prompts at least `rows` rows (up to
    /// [`PREFILL_CHUNK`]; [`MIN_PREFILL`] unless set), whatever the decode
    /// share. A backend where a round of hundreds of rows costs a few times
    /// one of a few rows (a GPU) takes whole chunks, so prompts reach their
    /// first token in a few rounds instead of dozens.
    pub fn with_min_prefill(mut self, rows: usize) -> Scheduler<C, K> {
        self.min_prefill = rows.clamp(1, PREFILL_CHUNK);
        self
    }

    /// Adds a stream that continues `prompt` (not empty) with at most
    /// `budget` tokens. `cache` is where its keys and values go: empty, or
    /// holding a prefix of `prompt` that is not prefilled again.
    pub fn admit(
        &mut self,
        client: C,
        prompt: Vec<u32>,
        budget: usize,
        drafter: Option<Box<dyn Drafter>>,
        mut cache: K,
    ) -> StreamId {
        assert!(!prompt.is_empty(), "a stream needs a prompt");
        // The last prompt token always runs, for the first token's logits.
        cache.truncate(prompt.len() - 1);
        let id = StreamId(self.next_id);
        self.next_id += 1;
        self.streams.push(Stream {
            id,
            client,
            prefilled: cache.len(),
            cache,
            context: prompt.clone(),
            prompt,
            pending: None,
            budget,
            produced: 0,
            drafter,
            draft: DraftStats::default(),
            admitted: Instant::now(),
            first_token: None,
            cancelled: false,
            error: None,
        });
        id
    }

    /// Live streams.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// Live streams still prefilling their prompts (no token yet).
    pub fn prefilling(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| s.first_token.is_none())
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = StreamId> + '_ {
        self.streams.iter().map(|s| s.id)
    }

    /// Ends a stream at the next round; its cache is freed then.
    pub fn cancel(&mut self, id: StreamId) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == id) {
            s.cancelled = true;
        }
    }

    /// Cache bytes the live streams hold now.
    pub fn cache_bytes(&self) -> usize {
        self.streams.iter().map(|s| s.cache.allocated_bytes()).sum()
    }

    /// Runs one round: a single forward over every stream's rows. Returns
    /// the streams that ended; when the forward fails, every stream ends
    /// with its error.
    pub fn round<F: PickingForward<Cache = K>>(&mut self, model: &F) -> Vec<Finished<C, K>> {
        let mut done = self.take(|s| s.cancelled);
        let started = Instant::now();
        let rows = self.plan();
        let total: usize = rows.iter().map(|r| r.tokens().len()).sum();
        if total == 0 {
            return done;
        }
        let draws: Vec<Option<Draw>> = self
            .streams
            .iter()
            .zip(&rows)
            .map(|(s, r)| match r {
                Rows::Decode(t) => s.client.draw(t.len()),
                Rows::Prefill(chunk) if s.prefilled + chunk.len() == s.prompt.len() => {
                    s.client.draw(1)
                }
                _ => None,
            })
            .collect();
        let logits = {
            let mut seqs: Vec<Seq<'_, K>> = self
                .streams
                .iter_mut()
                .zip(&rows)
                .map(|(s, r)| {
                    let prompt_ends = s.prefilled + r.tokens().len() == s.prompt.len();
                    Seq {
                        tokens: r.tokens(),
                        cache: &mut s.cache,
                        logits: match r {
                            Rows::Decode(_) => Logits::All,
                            Rows::Prefill(_) if prompt_ends => Logits::Last,
                            _ => Logits::None,
                        },
                    }
                })
                .collect();
            model.forward_picked(&mut seqs, &draws)
        };
        let logits = match logits {
            Ok(l) => l,
            Err(e) => {
                for s in &mut self.streams {
                    s.error = Some(e.clone());
                }
                done.extend(self.take(|_| true));
                return done;
            }
        };
        let elapsed = started.elapsed();
        let vocab = model.vocab_size();
        for ((s, r), logits) in self.streams.iter_mut().zip(rows).zip(logits) {
            let share = elapsed.mul_f64(r.tokens().len() as f64 / total as f64);
            match r {
                Rows::Idle => {}
                Rows::Prefill(chunk) => {
                    s.prefilled += chunk.len();
                    if s.prefilled == s.prompt.len() {
                        let token = s.token(&logits, 0, s.prompt.len(), vocab);
                        s.first_token = Some(Instant::now());
                        s.emit(token, row(&logits, 0, vocab));
                    }
                }
                Rows::Decode(rows) => s.verify(&rows[1..], &logits, vocab, share),
            }
        }
        done.extend(self.take(|s| s.first_token.is_some() && s.pending.is_none()));
        done
    }

    /// Each stream's rows for the next round.
    fn plan(&mut self) -> Vec<Rows> {
        let streams_decoding = self.streams.iter().filter(|s| s.pending.is_some()).count();
        let depth = (self.decode_rows / streams_decoding.max(1)).saturating_sub(1);
        let mut rows: Vec<Rows> = self
            .streams
            .iter_mut()
            .map(|s| match s.pending {
                Some(t) => {
                    // Drafts plus the bonus never pass the budget.
                    let room = (s.budget - s.produced)
                        .saturating_sub(1)
                        .min(MAX_DEPTH)
                        .min(depth);
                    let drafts = match &mut s.drafter {
                        Some(d) if room > 0 => d.propose(&s.context, room),
                        _ => Vec::new(),
                    };
                    let drafts = if drafts.is_empty() {
                        drafts
                    } else {
                        s.client.drafts(drafts)
                    };
                    Rows::Decode(std::iter::once(t).chain(drafts).collect())
                }
                None => Rows::Idle,
            })
            .collect();
        let decoding: usize = rows.iter().map(|r| r.tokens().len()).sum();
        let mut prefill = if decoding == 0 {
            PREFILL_CHUNK
        } else {
            let f = self.decode_share;
            ((decoding as f64 * (1.0 - f) / f).ceil() as usize)
                .clamp(self.min_prefill, PREFILL_CHUNK)
        };
        // Prompts prefill in arrival order.
        for (s, r) in self.streams.iter().zip(rows.iter_mut()) {
            if prefill == 0 {
                break;
            }
            if s.first_token.is_none() {
                let end = s.prompt.len().min(s.prefilled + prefill);
                prefill -= end - s.prefilled;
                *r = Rows::Prefill(s.prompt[s.prefilled..end].to_vec());
            }
        }
        rows
    }

    fn take(&mut self, ended: impl Fn(&Stream<C, K>) -> bool) -> Vec<Finished<C, K>> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.streams.len() {
            if ended(&self.streams[i]) {
                let mut s = self.streams.remove(i);
                // Positions past the context hold drafts after a reply's
                // last token (or a token never accepted): drop them.
                s.cache.truncate(s.context.len());
                s.context.truncate(s.cache.len());
                let now = Instant::now();
                let first = s.first_token.unwrap_or(now);
                done.push(Finished {
                    id: s.id,
                    client: s.client,
                    cancelled: s.cancelled,
                    error: s.error,
                    draft: s.draft,
                    prefill_time: first - s.admitted,
                    decode_time: now - first,
                    cache: s.cache,
                    tokens: s.context,
                });
            } else {
                i += 1;
            }
        }
        done
    }
}

/// Row `i` of a sequence's logits, `None` where the forward picked it.
fn row(rows: &SeqRows, i: usize, vocab: usize) -> Option<&[f32]> {
    match rows {
        SeqRows::Logits(logits) => Some(&logits[i * vocab..][..vocab]),
        SeqRows::Picks(_) => None,
    }
}

impl<C: Client, K: Cache> Stream<C, K> {
    /// Hands `token` to the client; it stays pending while the stream goes on.
    fn emit(&mut self, token: u32, row: Option<&[f32]>) -> bool {
        self.produced += 1;
        let goes_on = self.produced <= self.budget
            && self.client.accept(token, row)
            && self.produced < self.budget;
        self.pending = goes_on.then_some(token);
        if goes_on {
            self.context.push(token);
        }
        goes_on
    }

    /// Keeps the drafts the client's picks agree with, then the bonus token.
    /// Row `i`'s token, predicting `position`: the forward's pick, or the
    /// client's from the row.
    fn token(&self, rows: &SeqRows, i: usize, position: usize, vocab: usize) -> u32 {
        match rows {
            SeqRows::Picks(picks) => picks[i],
            SeqRows::Logits(logits) => self.client.pick(position, &logits[i * vocab..][..vocab]),
        }
    }

    fn verify(&mut self, drafts: &[u32], rows: &SeqRows, vocab: usize, elapsed: Duration) {
        let row = |i: usize| row(rows, i, vocab);
        let base = self.cache.len() - drafts.len() - 1;
        let (kept, bonus) = accept(drafts, |i| self.token(rows, i, base + 1 + i, vocab));
        self.cache.truncate(base + 1 + kept);
        if let Some(d) = &mut self.drafter {
            d.observe(drafts.len(), kept, elapsed);
        }
        self.draft.rounds += 1;
        self.draft.drafted += drafts.len();
        self.draft.accepted += kept;
        if drafts[..kept]
            .iter()
            .enumerate()
            .all(|(i, &t)| self.emit(t, row(i)))
        {
            self.emit(bonus, row(kept));
        }
    }
}
