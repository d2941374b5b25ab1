//! `cargo xtask soak`: the real server under sustained load. Thousands of
//! requests from 16-64 concurrent clients, mixed chat and completions,
//! streamed or not, greedy or sampled; some clients hang up mid-reply,
//! some read slowly, some send malformed or oversized bodies. Reports 5xx
//! answers, latency percentiles and peak resident memory against the
//! budget; fails unless no request got a 5xx, the server never panicked,
//! every completed greedy reply equals the same request served alone, and
//! reserved cache memory went back to idle with retained prompts within
//! their limit, and resident memory besides the retained prompts did not
//! grow over the second half of the requests.

use crate::peer::load::prompt;
use crate::peer::server::{free_port, Server};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct SoakArgs {
    /// Requests to send.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Clients sending at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Share of requests whose client hangs up mid-reply.
    #[arg(long, default_value_t = 0.2)]
    pub disconnects: f64,
    /// The model (default: SmolLM2 from the registry).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The server's memory budget in GiB (`TENSORFOLD_MEMORY_LIMIT_GB`).
    #[arg(long, default_value_t = 4.0)]
    pub memory_gib: f64,
    /// The CI form: 300 requests at 16 clients, with the test build.
    #[arg(long)]
    pub short: bool,
}

/// Distinct prompts; each is served alone once for the reference bytes.
const PROMPTS: usize = 24;
/// Bytes the server accepts in a body (its default); oversized bodies pass it.
const MAX_BODY: usize = 8 << 20;
/// Retained prompt states may hold this much (`--prompt-cache-gib`).
const PROMPT_CACHE_GIB: f64 = 0.25;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Route {
    Chat,
    Completions,
}

/// What one request does, fixed by its index.
#[derive(Clone, Copy, Debug)]
struct Plan {
    route: Route,
    prompt: usize,
    stream: bool,
    sampled: bool,
    hang_up: bool,
    slow: bool,
    malformed: bool,
    oversized: bool,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Plan {
    fn of(index: usize, disconnects: f64) -> Plan {
        let mut state = index as u64;
        let mut draw = || {
            state = splitmix(state);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        Plan {
            route: if draw() < 0.5 {
                Route::Chat
            } else {
                Route::Completions
            },
            prompt: (draw() * PROMPTS as f64) as usize,
            stream: draw() < 0.5,
            sampled: draw() < 0.3,
            hang_up: draw() < disconnects,
            slow: draw() < 0.1,
            malformed: draw() < 0.03,
            oversized: draw() < 0.005,
        }
    }

    /// Reply length: fixed per prompt, so the reference is the same request.
    fn max_tokens(&self) -> usize {
        [8, 16, 24][self.prompt % 3]
    }

    fn body(&self, index: usize) -> Value {
        let text = prompt(self.prompt, 40 + 30 * (self.prompt % 4));
        let mut body = match self.route {
            Route::Chat => json!({"messages": [{"role": "user", "content": text}]}),
            Route::Completions => json!({"prompt": text}),
        };
        body["max_tokens"] = json!(self.max_tokens());
        body["ignore_eos"] = json!(true);
        body["stream"] = json!(self.stream);
        if self.sampled {
            body["temperature"] = json!(0.8);
            body["top_p"] = json!(0.95);
            body["seed"] = json!(index);
        } else {
            body["temperature"] = json!(0.0);
        }
        body
    }
}

fn path(route: Route) -> &'static str {
    match route {
        Route::Chat => "/v1/chat/completions",
        Route::Completions => "/v1/completions",
    }
}

/// How one request ended.
#[derive(Default)]
struct Outcome {
    status: u16,
    /// The reply text, when the client read it all.
    text: Option<String>,
    /// A stream that carried an error event (a 500 after the headers).
    stream_error: bool,
    latency: Duration,
}

fn send(agent: &ureq::Agent, url: &str, index: usize, plan: &Plan) -> Outcome {
    let started = Instant::now();
    let target = format!("{url}{}", path(plan.route));
    let request = agent.post(&target).set("content-type", "application/json");
    let sent = if plan.oversized {
        let mut body = br#"{"prompt": ""#.to_vec();
        body.resize(MAX_BODY + 1024, b'a');
        body.extend_from_slice(br#""}"#);
        request.send_bytes(&body)
    } else if plan.malformed {
        let mut body = plan.body(index).to_string().into_bytes();
        body.truncate(body.len() / 2);
        request.send_bytes(&body)
    } else {
        request.send_json(plan.body(index))
    };
    let response = match sent {
        Ok(r) => r,
        Err(ureq::Error::Status(status, r)) => {
            let _ = r.into_string();
            return Outcome {
                status,
                latency: started.elapsed(),
                ..Outcome::default()
            };
        }
        Err(_) => return Outcome::default(),
    };
    let status = response.status();
    let mut outcome = Outcome {
        status,
        ..Outcome::default()
    };
    if !plan.stream {
        if plan.hang_up {
            // Gone before reading: the reply may still be generating.
            return outcome;
        }
        let Ok(body) = response.into_string() else {
            return outcome;
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let choice = &v["choices"][0];
        outcome.text = choice["message"]["content"]
            .as_str()
            .or(choice["text"].as_str())
            .map(str::to_owned);
        outcome.latency = started.elapsed();
        return outcome;
    }
    let mut text = String::new();
    let mut lines = BufReader::new(response.into_reader()).lines();
    let mut events = 0;
    while let Some(Ok(line)) = lines.next() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            outcome.text = Some(text);
            outcome.latency = started.elapsed();
            return outcome;
        }
        let event: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        if event.get("error").is_some() {
            outcome.stream_error = true;
        }
        let choice = &event["choices"][0];
        if let Some(delta) = choice["delta"]["content"]
            .as_str()
            .or(choice["text"].as_str())
        {
            text.push_str(delta);
        }
        events += 1;
        if plan.hang_up && events == 2 {
            // Mid-stream: dropping the reader closes the connection.
            return outcome;
        }
        if plan.slow {
            std::thread::sleep(Duration::from_millis(30));
        }
    }
    outcome
}

/// `/metrics` as name -> value.
fn metrics(agent: &ureq::Agent, url: &str) -> Result<HashMap<String, f64>> {
    let text = agent.get(&format!("{url}/metrics")).call()?.into_string()?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect())
}

/// Peak resident memory of process `pid` (Linux `VmHWM`), in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A metric's value, NaN when the server did not report it.
fn gauge(m: &HashMap<String, f64>, name: &str) -> f64 {
    m.get(name).copied().unwrap_or(f64::NAN)
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let at = ((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1);
    sorted.get(at).map_or(f64::NAN, |d| d.as_secs_f64())
}

pub fn run(mut args: SoakArgs) -> Result<()> {
    if args.short {
        args.requests = 300;
        args.concurrency = 16;
    }
    let root = crate::workspace_root();
    let model = match args.model.take() {
        Some(m) => m,
        None => {
            crate::fetch(false)?;
            root.join("models/smollm2-135m-instruct-q4_1.gguf")
        }
    };
    let profile = if args.short { "debug" } else { "release" };
    let mut build = vec!["build", "--quiet", "-p", "tensorfold"];
    if !args.short {
        build.push("--release");
    }
    crate::cargo(&build)?;
    let bin = crate::target_dir().join(profile).join("tensorfold");
    let port = free_port()?;
    let log = std::env::temp_dir().join(format!("tensorfold-soak-{port}.log"));
    let mut command = Command::new(&bin);
    command
        .arg("serve")
        .arg(&model)
        .args(["--port", &port.to_string()])
        .args(["--prompt-cache-gib", &PROMPT_CACHE_GIB.to_string()])
        .args(["--queue", &(args.concurrency + 8).to_string()])
        .env("TENSORFOLD_MEMORY_LIMIT_GB", args.memory_gib.to_string());
    let server = Server::start(command, port, &log, Duration::from_secs(120))?;
    let url = server.url.clone();
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(300))
        .build();

    // The references: each greedy request kind served alone.
    let mut solo: HashMap<(Route, usize), String> = HashMap::new();
    for route in [Route::Chat, Route::Completions] {
        for prompt in 0..PROMPTS {
            let plan = Plan {
                route,
                prompt,
                stream: false,
                sampled: false,
                hang_up: false,
                slow: false,
                malformed: false,
                oversized: false,
            };
            let outcome = send(&agent, &url, 0, &plan);
            let Some(text) = outcome.text.filter(|_| outcome.status == 200) else {
                bail!("reference {route:?} {prompt} failed: {}", outcome.status);
            };
            solo.insert((route, prompt), text);
        }
    }
    let idle = metrics(&agent, &url)?;
    println!(
        "soak: {} requests at {} clients, {:.0}% hang-ups, model {}",
        args.requests,
        args.concurrency,
        args.disconnects * 100.0,
        model.display()
    );

    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    // Resident memory and retained prompt bytes when half the requests are
    // done: a leak grows with the requests served; memory the allocator
    // keeps after a peak does not, and retained prompts, which may grow up
    // to their own limit (checked apart), are not counted against it.
    let halfway: Mutex<Option<(f64, f64)>> = Mutex::new(None);
    let results: Mutex<Vec<(Plan, Outcome)>> = Mutex::new(Vec::with_capacity(args.requests));
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..args.concurrency {
            scope.spawn(|| {
                let agent = ureq::AgentBuilder::new()
                    .timeout(Duration::from_secs(600))
                    .build();
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= args.requests {
                        return;
                    }
                    let plan = Plan::of(index, args.disconnects);
                    let outcome = send(&agent, &url, index, &plan);
                    results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((plan, outcome));
                    if finished.fetch_add(1, Ordering::Relaxed) + 1 == args.requests / 2 {
                        if let Ok(m) = metrics(&agent, &url) {
                            let rss = gauge(&m, "tensorfold_resident_memory_bytes");
                            let retained = gauge(&m, "tensorfold_retained_prompt_bytes");
                            *halfway.lock().unwrap_or_else(|e| e.into_inner()) =
                                Some((rss, retained));
                        }
                    }
                }
            });
        }
    });
    let wall = started.elapsed();

    // Idle again: nothing queued or running.
    let settle = Instant::now();
    let after = loop {
        let m = metrics(&agent, &url)?;
        let busy = m.get("tensorfold_running").copied().unwrap_or(0.0)
            + m.get("tensorfold_queue_depth").copied().unwrap_or(0.0);
        if busy == 0.0 || settle.elapsed() > Duration::from_secs(60) {
            break m;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let peak = peak_rss(server.pid()).unwrap_or(0);
    drop(server);
    let mut log_text = String::new();
    std::fs::File::open(&log)?.read_to_string(&mut log_text)?;
    let panics = log_text.matches("panicked").count();

    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let server_errors = results
        .iter()
        .filter(|(_, o)| o.status >= 500 || o.stream_error)
        .count();
    let unanswered = results
        .iter()
        .filter(|(p, o)| o.status == 0 && !p.hang_up)
        .count();
    let refused_bad = results
        .iter()
        .filter(|(p, o)| (p.malformed || p.oversized) && (400..500).contains(&o.status))
        .count();
    let bad = results
        .iter()
        .filter(|(p, _)| p.malformed || p.oversized)
        .count();
    let mut greedy_checked = 0;
    let mut greedy_differ = 0;
    for (plan, outcome) in &results {
        let wellformed = !plan.malformed && !plan.oversized;
        if let (true, false, Some(text)) = (wellformed, plan.sampled, &outcome.text) {
            if outcome.status == 200 && !outcome.stream_error {
                greedy_checked += 1;
                let alone = solo.get(&(plan.route, plan.prompt));
                if alone != Some(text) {
                    greedy_differ += 1;
                    eprintln!(
                        "  differs from alone: {plan:?}\n    served: {text:?}\n    alone:  {alone:?}"
                    );
                }
            }
        }
    }
    let mut latencies: Vec<Duration> = results
        .iter()
        .filter(|(_, o)| o.text.is_some())
        .map(|(_, o)| o.latency)
        .collect();
    latencies.sort();
    let budget = (args.memory_gib * (1u64 << 30) as f64) as u64;
    let retained_limit = PROMPT_CACHE_GIB * (1u64 << 30) as f64;
    let hung_up = results.iter().filter(|(p, _)| p.hang_up).count();
    println!(
        "  wall {:.1} s, {:.1} requests/s",
        wall.as_secs_f64(),
        results.len() as f64 / wall.as_secs_f64()
    );
    println!("  5xx (or stream error events): {server_errors}; unanswered: {unanswered}; panics in the log: {panics}; round faults: {}", gauge(&after, "tensorfold_round_faults_total"));
    println!("  hung up mid-reply: {hung_up}; malformed or oversized refused with 4xx: {refused_bad} of {bad}");
    println!(
        "  latency of completed requests: p50 {:.3} s, p95 {:.3} s, p99 {:.3} s, max {:.3} s",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.95),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    println!(
        "  completed greedy replies equal to the request served alone: {} of {greedy_checked}",
        greedy_checked - greedy_differ
    );
    let halfway = halfway.into_inner().unwrap_or_else(|e| e.into_inner());
    let after_rss = gauge(&after, "tensorfold_resident_memory_bytes");
    let after_retained = gauge(&after, "tensorfold_retained_prompt_bytes");
    println!(
        "  peak RSS {:.0} MiB of a {:.0} MiB budget; RSS idle {:.0} MiB -> half the requests {:.0} MiB -> after {:.0} MiB",
        peak as f64 / 1048576.0,
        budget as f64 / 1048576.0,
        gauge(&idle, "tensorfold_resident_memory_bytes") / 1048576.0,
        halfway.map_or(f64::NAN, |(rss, _)| rss) / 1048576.0,
        after_rss / 1048576.0
    );
    println!(
        "  reserved cache bytes idle {} -> after {}; retained prompt bytes idle {} -> half the requests {} -> after {} (limit {})",
        gauge(&idle, "tensorfold_reserved_cache_bytes"),
        gauge(&after, "tensorfold_reserved_cache_bytes"),
        gauge(&idle, "tensorfold_retained_prompt_bytes"),
        halfway.map_or(f64::NAN, |(_, retained)| retained),
        after_retained,
        retained_limit
    );
    let mut failures = Vec::new();
    if server_errors > 0 {
        failures.push(format!("{server_errors} requests answered 5xx"));
    }
    if unanswered > 0 {
        failures.push(format!("{unanswered} requests got no answer"));
    }
    if panics > 0 || gauge(&after, "tensorfold_round_faults_total") != 0.0 {
        failures.push("the server panicked or a round failed".into());
    }
    if refused_bad != bad {
        failures.push(format!(
            "{} bad bodies were not refused with a 4xx",
            bad - refused_bad
        ));
    }
    if greedy_differ > 0 {
        failures.push(format!(
            "{greedy_differ} greedy replies differ from the same request served alone"
        ));
    }
    if gauge(&after, "tensorfold_reserved_cache_bytes") != 0.0
        || gauge(&after, "tensorfold_running") != 0.0
        || gauge(&after, "tensorfold_queue_depth") != 0.0
    {
        failures.push("reserved memory, running or queued requests did not return to idle".into());
    }
    if after_retained > retained_limit {
        failures.push("retained prompts exceed their limit".into());
    }
    if peak > budget {
        failures.push("peak RSS exceeds the memory budget".into());
    }
    // The second half serves as many requests as the first: resident memory
    // besides the retained prompts may hold its peak but not grow with them
    // (10% and 32 MiB of slack).
    if let Some((half_rss, half_retained)) = halfway {
        let (half, after) = (half_rss - half_retained, after_rss - after_retained);
        if after > half * 1.1 + 32.0 * 1048576.0 {
            failures.push(
                "resident memory besides retained prompts grew over the second half of the requests"
                    .into(),
            );
        }
    }
    if !failures.is_empty() {
        bail!(
            "soak failed: {}; server log {}",
            failures.join("; "),
            log.display()
        );
    }
    println!("soak passed");
    Ok(())
}
