//! The load generator: N concurrent streamed `/v1/completions` requests
//! against an OpenAI-style server, each reply checked against the same
//! request served alone.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// What every request of a run shares.
#[derive(Clone)]
pub struct LoadSpec {
    pub max_tokens: usize,
    /// Prompt length in characters (about tokens times the model's
    /// characters per token).
    pub prompt_chars: usize,
    /// `None` is greedy; else (temperature, top_p); the seed is per request.
    pub sampling: Option<(f64, f64)>,
    /// `false` asks for the serial decode (`"draft": false`; a server
    /// without drafts ignores the field).
    pub draft: bool,
    /// Longest a level (or one solo request) may take before its
    /// unfinished streams are dropped and the level reported as timed out.
    pub deadline: Duration,
}

/// One level's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Level {
    pub streams: usize,
    /// Completion tokens of every stream over the level's wall time.
    pub aggregate_tokens_per_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p95_s: f64,
    /// Streams whose reply equals the same request served alone.
    pub equal_to_solo: usize,
    /// Streams that failed (non-200, a broken stream) or did not finish in time.
    pub failed: usize,
    pub timed_out: bool,
    pub wall_s: f64,
}

/// One request's outcome.
struct Reply {
    text: String,
    tokens: usize,
    ttft: Option<Duration>,
    ok: bool,
}

/// Serves every prompt alone (the references), then each level.
pub fn run(url: &str, levels: &[usize], spec: &LoadSpec) -> Vec<Level> {
    let most = levels.iter().copied().max().unwrap_or(0);
    // Warm-up: first-request costs (allocation, graph capture) stay out.
    send(url, 10_000, spec, Instant::now() + spec.deadline);
    let solo: Vec<Option<String>> = (0..most)
        .map(|i| {
            let reply = send(url, i, spec, Instant::now() + spec.deadline);
            reply.ok.then_some(reply.text)
        })
        .collect();
    levels
        .iter()
        .map(|&streams| level(url, streams, spec, &solo))
        .collect()
}

fn level(url: &str, streams: usize, spec: &LoadSpec, solo: &[Option<String>]) -> Level {
    let started = Instant::now();
    let deadline = started + spec.deadline;
    let replies: Vec<Reply> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..streams)
            .map(|i| scope.spawn(move || send(url, i, spec, deadline)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or(Reply {
                    text: String::new(),
                    tokens: 0,
                    ttft: None,
                    ok: false,
                })
            })
            .collect()
    });
    let wall = started.elapsed().as_secs_f64();
    let tokens: usize = replies.iter().filter(|r| r.ok).map(|r| r.tokens).sum();
    let mut ttfts: Vec<f64> = replies
        .iter()
        .filter_map(|r| r.ttft.map(|t| t.as_secs_f64()))
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        ttfts
            .get(((ttfts.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let failed = replies.iter().filter(|r| !r.ok).count();
    Level {
        streams,
        aggregate_tokens_per_s: tokens as f64 / wall,
        ttft_p50_s: quantile(0.5),
        ttft_p95_s: quantile(0.95),
        equal_to_solo: replies
            .iter()
            .enumerate()
            .filter(|(i, r)| r.ok && solo.get(*i).and_then(Option::as_ref) == Some(&r.text))
            .count(),
        failed,
        timed_out: Instant::now() >= deadline && failed > 0,
        wall_s: wall,
    }
}

/// Request `index`'s prompt: words drawn from a fixed list by a per-index
/// generator, so both servers and every level see the same text.
pub fn prompt(index: usize, chars: usize) -> String {
    const WORDS: &[&str] = &[
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "seven",
        "wizards",
        "quietly",
        "hex",
        "jovial",
        "bookkeeper",
        "river",
        "stone",
        "garden",
        "light",
    ];
    let mut state = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut text = String::new();
    while text.len() < chars {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS[(state >> 33) as usize % WORDS.len()]);
    }
    text
}

fn body(index: usize, spec: &LoadSpec) -> Value {
    let mut body = json!({
        "prompt": prompt(index, spec.prompt_chars),
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some((temperature, top_p)) = spec.sampling {
        body["temperature"] = json!(temperature);
        body["top_p"] = json!(top_p);
        body["seed"] = json!(1000 + index);
    }
    if !spec.draft {
        body["draft"] = json!(false);
    }
    body
}

/// One streamed request; reads server-sent events until `[DONE]`.
fn send(url: &str, index: usize, spec: &LoadSpec, deadline: Instant) -> Reply {
    let mut reply = Reply {
        text: String::new(),
        tokens: 0,
        ttft: None,
        ok: false,
    };
    let Some(budget) = deadline.checked_duration_since(Instant::now()) else {
        return reply;
    };
    let started = Instant::now();
    let agent = ureq::AgentBuilder::new().timeout(budget).build();
    let Ok(response) = agent
        .post(&format!("{url}/v1/completions"))
        .send_json(body(index, spec))
    else {
        return reply;
    };
    let mut chunks = 0;
    let mut usage = None;
    let mut finished = false;
    for line in BufReader::new(response.into_reader()).lines() {
        let Ok(line) = line else { return reply };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            break;
        }
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return reply;
        };
        if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
            usage = Some(n as usize);
        }
        if let Some(choice) = event["choices"].get(0) {
            let text = choice["text"].as_str().unwrap_or("");
            if !text.is_empty() {
                reply.ttft.get_or_insert_with(|| started.elapsed());
                reply.text.push_str(text);
                chunks += 1;
            }
            finished |= choice["finish_reason"].is_string();
        }
    }
    // Servers that report no usage in streams send one token a chunk.
    reply.tokens = usage.unwrap_or(chunks);
    reply.ok = finished && reply.tokens > 0;
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_fixed_by_index_and_length() {
        assert_eq!(prompt(3, 200), prompt(3, 200));
        assert_ne!(prompt(3, 200), prompt(4, 200));
        let text = prompt(7, 200);
        assert!(text.len() >= 200 && text.len() < 220, "{}", text.len());
    }

    #[test]
    fn sampled_bodies_carry_a_seed_per_request() {
        let spec = LoadSpec {
            max_tokens: 8,
            prompt_chars: 40,
            sampling: Some((0.8, 0.95)),
            draft: true,
            deadline: Duration::from_secs(1),
        };
        let (a, b) = (body(0, &spec), body(1, &spec));
        assert_eq!(a["temperature"], 0.8);
        assert_ne!(a["seed"], b["seed"]);
        assert_eq!(a["ignore_eos"], true);
        let greedy = LoadSpec {
            sampling: None,
            ..spec
        };
        assert_eq!(body(0, &greedy)["temperature"], 0.0);
        assert!(body(0, &greedy).get("seed").is_none());
        assert!(body(0, &greedy).get("draft").is_none());
        let serial = LoadSpec {
            draft: false,
            ..greedy
        };
        assert_eq!(body(0, &serial)["draft"], false);
    }

    #[test]
    fn a_server_that_does_not_answer_fails_the_level_in_time() {
        // A listener that accepts and never replies.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let spec = LoadSpec {
            max_tokens: 4,
            prompt_chars: 10,
            sampling: None,
            draft: true,
            deadline: Duration::from_millis(300),
        };
        let started = Instant::now();
        let result = level(&url, 2, &spec, &[None, None]);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(result.failed, 2);
        assert!(result.timed_out);
        assert_eq!(result.equal_to_solo, 0);
        drop(listener);
    }
}
