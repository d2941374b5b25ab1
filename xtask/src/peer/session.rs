//! The agent-session cell: one conversation of many turns through a server,
//! as a coding agent drives it. A system prompt, then each turn a tool's
//! output of about `tool_tokens` tokens and a short greedy reply; the whole
//! history is sent again every turn, so a server that keeps what it already
//! computed prefills only the new message. Time to first token per turn is
//! what the agent waits for.

use super::load;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// The conversation every engine is put through.
#[derive(Clone)]
pub struct SessionSpec {
    pub turns: usize,
    /// Characters of each tool output (about tokens times the model's
    /// characters per token).
    pub tool_chars: usize,
    pub reply_tokens: usize,
    /// Longest one turn may take.
    pub deadline: Duration,
}

impl SessionSpec {
    /// Context one server slot needs for the whole session, in tokens, with
    /// slack for the chat template (at least 3 characters a token).
    pub fn context_tokens(&self) -> usize {
        let per_turn = self.tool_chars / 3 + self.reply_tokens + 64;
        (SYSTEM.len() / 3 + self.turns * per_turn + 256).next_multiple_of(1024)
    }
}

/// One turn's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Turn {
    /// From sending the request to the first token of the reply.
    pub ttft_s: f64,
    /// Prompt tokens, where the server reports them.
    pub prompt_tokens: Option<usize>,
    /// Prompt tokens the server took from what it kept, where it reports them.
    #[serde(default)]
    pub cached_tokens: Option<usize>,
    pub reply: String,
}

/// The turns one engine served; `error` says why the session stopped early.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Session {
    pub turns: Vec<Turn>,
    pub error: Option<String>,
}

impl Session {
    pub fn ttft_sum(&self) -> f64 {
        self.turns.iter().map(|t| t.ttft_s).sum()
    }

    /// The last turn's time to first token over the first turn's.
    pub fn growth(&self) -> Option<f64> {
        let (first, last) = (self.turns.first()?, self.turns.last()?);
        (first.ttft_s > 0.0).then(|| last.ttft_s / first.ttft_s)
    }
}

const SYSTEM: &str = "You are a coding agent working in a Rust repository. \
You run tools (read_file, grep, run_tests, list_dir) and read their output, \
then decide on the next step. Keep every answer short: one or two sentences \
that say what the output shows and what to do next. Never repeat the tool \
output. When the tests pass and the change is complete, say DONE. The \
repository builds with cargo; tests run with cargo test; formatting with \
cargo fmt. Prefer small, reviewable changes and explain each one briefly.";

const TOOLS: &[&str] = &["read_file", "grep", "run_tests", "list_dir"];

/// Turn `i`'s new message: a tool's output.
fn tool_message(i: usize, chars: usize) -> String {
    format!(
        "Output of `{}` (step {}):\n{}\nWhat next?",
        TOOLS[i % TOOLS.len()],
        i + 1,
        load::prompt(500 + i, chars)
    )
}

/// Runs the session against `url`; stops at the first failed turn.
pub fn run(url: &str, spec: &SessionSpec) -> Session {
    let mut session = Session::default();
    // Warm-up, on a prompt the session does not share.
    let warm = [json!({"role": "user", "content": "Say hello."})];
    if let Err(e) = turn(url, &warm, spec) {
        session.error = Some(format!("warm-up: {e}"));
        return session;
    }
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    for i in 0..spec.turns {
        messages.push(json!({"role": "user", "content": tool_message(i, spec.tool_chars)}));
        match turn(url, &messages, spec) {
            Ok(t) => {
                messages.push(json!({"role": "assistant", "content": t.reply}));
                session.turns.push(t);
            }
            Err(e) => {
                session.error = Some(format!("turn {}: {e}", i + 1));
                break;
            }
        }
    }
    session
}

/// One streamed greedy chat completion over `messages`.
fn turn(url: &str, messages: &[Value], spec: &SessionSpec) -> Result<Turn, String> {
    let body = json!({
        "messages": messages,
        "max_tokens": spec.reply_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let started = Instant::now();
    let agent = ureq::AgentBuilder::new().timeout(spec.deadline).build();
    let response = agent
        .post(&format!("{url}/v1/chat/completions"))
        .send_json(body)
        .map_err(|e| e.to_string())?;
    let (mut ttft, mut reply) = (None, String::new());
    let (mut prompt_tokens, mut cached_tokens) = (None, None);
    let mut finished = false;
    for line in BufReader::new(response.into_reader()).lines() {
        let line = line.map_err(|e| format!("broken stream: {e}"))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            break;
        }
        let event: Value = serde_json::from_str(data).map_err(|e| format!("bad event: {e}"))?;
        if let Some(n) = event["usage"]["prompt_tokens"].as_u64() {
            prompt_tokens = Some(n as usize);
        }
        if let Some(n) = event["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
            cached_tokens = Some(n as usize);
        }
        if let Some(choice) = event["choices"].get(0) {
            let text = choice["delta"]["content"].as_str().unwrap_or("");
            if !text.is_empty() {
                ttft.get_or_insert_with(|| started.elapsed());
                reply.push_str(text);
            }
            finished |= choice["finish_reason"].is_string();
        }
    }
    if !finished {
        return Err("the stream ended before the reply finished".into());
    }
    Ok(Turn {
        // A reply that ended at once waited for its whole request.
        ttft_s: ttft.unwrap_or_else(|| started.elapsed()).as_secs_f64(),
        prompt_tokens,
        cached_tokens,
        reply,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_outputs_are_fixed_and_differ_by_turn() {
        assert_eq!(tool_message(2, 2000), tool_message(2, 2000));
        assert_ne!(tool_message(2, 2000), tool_message(3, 2000));
        assert!(tool_message(0, 2000).len() > 2000);
    }

    #[test]
    fn the_context_holds_every_turn() {
        let spec = SessionSpec {
            turns: 12,
            tool_chars: 2000,
            reply_tokens: 24,
            deadline: Duration::from_secs(1),
        };
        let needed = 12 * (2000 / 3 + 24);
        assert!(spec.context_tokens() > needed && spec.context_tokens().is_multiple_of(1024));
    }

    #[test]
    fn sums_and_growth_come_from_the_turns() {
        let turn = |s: f64| Turn {
            ttft_s: s,
            prompt_tokens: None,
            cached_tokens: None,
            reply: String::new(),
        };
        let session = Session {
            turns: vec![turn(1.0), turn(2.0), turn(1.5)],
            error: None,
        };
        assert_eq!(session.ttft_sum(), 4.5);
        assert_eq!(session.growth(), Some(1.5));
        assert_eq!(Session::default().growth(), None);
    }
}
