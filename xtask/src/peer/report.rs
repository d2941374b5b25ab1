//! The results of one peer run: kept as JSON, printed as Markdown tables
//! (both engines side by side, with the ratio TensorFold / peer).

use super::cells::Figures;
use super::load::Level;
use super::session::Session;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Serialize, Deserialize)]
pub struct Report {
    /// UTC, when the run started.
    pub date: String,
    pub machine: String,
    pub backend: String,
    /// The command line that produced it.
    pub command: String,
    /// `git describe` of the TensorFold tree.
    pub tensorfold_version: String,
    pub peer_version: String,
    pub models: Vec<ModelReport>,
}

#[derive(Serialize, Deserialize)]
pub struct ModelReport {
    pub name: String,
    pub file: String,
    pub bytes: u64,
    /// The one-stream cells, in table order.
    pub cells: Vec<String>,
    /// The peer first, TensorFold last.
    pub engines: Vec<EngineReport>,
}

#[derive(Serialize, Deserialize)]
pub struct EngineReport {
    pub engine: String,
    /// Why this engine has no figures (it could not be built or started).
    pub error: Option<String>,
    pub cells: Figures,
    /// Why the one-stream cells are missing, when they are.
    pub cells_error: Option<String>,
    /// Why single cells are missing (past the model's window, say).
    #[serde(default)]
    pub cell_errors: BTreeMap<String, String>,
    /// Serving levels by mode (`greedy`, `sampled`).
    pub serving: BTreeMap<String, Vec<Level>>,
    pub serving_error: Option<String>,
    /// The agent session, where it ran.
    #[serde(default)]
    pub session: Option<Session>,
}

impl EngineReport {
    pub fn new(engine: &str) -> EngineReport {
        EngineReport {
            engine: engine.to_string(),
            error: None,
            cells: Figures::new(),
            cells_error: None,
            cell_errors: BTreeMap::new(),
            serving: BTreeMap::new(),
            serving_error: None,
            session: None,
        }
    }

    fn level(&self, mode: &str, streams: usize) -> Option<&Level> {
        self.serving
            .get(mode)?
            .iter()
            .find(|l| l.streams == streams)
    }

    /// What a missing figure says instead.
    fn missing(&self, part: &Option<String>) -> String {
        match self.error.as_ref().or(part.as_ref()) {
            Some(why) => format!("failed: {}", one_line(why)),
            None => "–".into(),
        }
    }
}

fn one_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    line.chars().take(60).collect()
}

fn ratio(ours: Option<f64>, theirs: Option<f64>) -> String {
    match (ours, theirs) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() => format!("{:.2}x", a / b),
        _ => "–".into(),
    }
}

fn rate(value: Option<f64>, otherwise: String) -> String {
    value.map_or(otherwise, |v| format!("{v:.1}"))
}

/// The Markdown tables of one model.
pub fn tables(model: &ModelReport) -> String {
    let mut out = String::new();
    let (peer, ours) = (&model.engines[0], &model.engines[model.engines.len() - 1]);
    let _ = writeln!(
        out,
        "### {} (`{}`, {:.1} MB)\n",
        model.name,
        model.file,
        model.bytes as f64 / 1e6
    );
    if !model.cells.is_empty() {
        let _ = writeln!(
            out,
            "| cell (tokens/s) | {} | {} | ratio |\n|---|---|---|---|",
            peer.engine, ours.engine
        );
    }
    for cell in &model.cells {
        let (a, b) = (peer.cells.get(cell).copied(), ours.cells.get(cell).copied());
        let missing = |engine: &EngineReport| {
            let why = engine.cell_errors.get(cell).cloned();
            engine.missing(&why.or(engine.cells_error.clone()))
        };
        let _ = writeln!(
            out,
            "| {cell} | {} | {} | {} |",
            rate(a, missing(peer)),
            rate(b, missing(ours)),
            ratio(b, a)
        );
    }
    let modes: Vec<&String> = ours
        .serving
        .keys()
        .chain(peer.serving.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !modes.is_empty() || peer.serving_error.is_some() || ours.serving_error.is_some() {
        serving_table(&mut out, peer, ours, modes);
    }
    if peer.session.is_some() || ours.session.is_some() {
        session_table(&mut out, peer, ours);
    }
    out
}

/// The agent session turn by turn: each engine's time to first token, the
/// ratio TensorFold / peer (below 1 is faster), and whether both replied
/// the same; then the sums and each engine's last turn over its first.
fn session_table(out: &mut String, peer: &EngineReport, ours: &EngineReport) {
    let empty = Session::default();
    let (a, b) = (
        peer.session.as_ref().unwrap_or(&empty),
        ours.session.as_ref().unwrap_or(&empty),
    );
    let _ = writeln!(
        out,
        "\n| agent session | {p} TTFT (s) | {o} TTFT (s) | ratio | same reply |\n|---|---|---|---|---|",
        p = peer.engine,
        o = ours.engine
    );
    let seconds = |s: Option<f64>| s.map_or("–".into(), |s| format!("{s:.2}"));
    let turns = a.turns.len().max(b.turns.len());
    let mut same = 0;
    for i in 0..turns {
        let (x, y) = (a.turns.get(i), b.turns.get(i));
        let equal = match (x, y) {
            (Some(x), Some(y)) if x.reply == y.reply => {
                same += 1;
                "yes"
            }
            (Some(_), Some(_)) => "no",
            _ => "–",
        };
        let (x, y) = (x.map(|t| t.ttft_s), y.map(|t| t.ttft_s));
        let _ = writeln!(
            out,
            "| turn {} | {} | {} | {} | {equal} |",
            i + 1,
            seconds(x),
            seconds(y),
            ratio(y, x)
        );
    }
    let complete =
        |s: &Session| (!s.turns.is_empty() && s.turns.len() == turns).then(|| s.ttft_sum());
    let _ = writeln!(
        out,
        "| sum | {} | {} | {} | {same}/{turns} |",
        seconds(complete(a)),
        seconds(complete(b)),
        ratio(complete(b), complete(a))
    );
    let growth = |s: &Session| s.growth().map_or("–".into(), |g| format!("{g:.2}x"));
    let _ = writeln!(
        out,
        "| last turn / first | {} | {} | | |",
        growth(a),
        growth(b)
    );
    for (engine, session) in [(peer, a), (ours, b)] {
        if let Some(why) = engine.error.as_ref().or(session.error.as_ref()) {
            let _ = writeln!(out, "\n{} session: {}", engine.engine, one_line(why));
        }
    }
}

/// The serving levels of both engines, mode by mode.
fn serving_table(out: &mut String, peer: &EngineReport, ours: &EngineReport, modes: Vec<&String>) {
    let _ = writeln!(
        out,
        "\n| server | streams | {p} tok/s | {o} tok/s | ratio | {p} TTFT p50 / p95 (s) | {o} TTFT p50 / p95 (s) | {p} equal to solo | {o} equal to solo |\n|---|---|---|---|---|---|---|---|---|",
        p = peer.engine,
        o = ours.engine
    );
    let mut levels: Vec<usize> = [peer, ours]
        .iter()
        .flat_map(|e| e.serving.values().flatten().map(|l| l.streams))
        .collect();
    levels.sort_unstable();
    levels.dedup();
    for mode in modes {
        for &streams in &levels {
            let (a, b) = (peer.level(mode, streams), ours.level(mode, streams));
            let figure = |engine: &EngineReport, level: Option<&Level>| match level {
                Some(l) if l.timed_out && l.failed == l.streams => {
                    format!("no answer in {:.0} s", l.wall_s)
                }
                Some(l) => format!("{:.1}", l.aggregate_tokens_per_s),
                None => engine.missing(&engine.serving_error),
            };
            let ttft = |level: Option<&Level>| {
                level.map_or("–".into(), |l| {
                    format!("{:.2} / {:.2}", l.ttft_p50_s, l.ttft_p95_s)
                })
            };
            let equal = |level: Option<&Level>| {
                level.map_or("–".into(), |l| {
                    let mut s = format!("{}/{}", l.equal_to_solo, l.streams);
                    if l.failed > 0 {
                        let _ = write!(s, " ({} failed)", l.failed);
                    }
                    s
                })
            };
            let finished = |l: Option<&Level>| {
                l.filter(|l| l.failed < l.streams)
                    .map(|l| l.aggregate_tokens_per_s)
            };
            let _ = writeln!(
                out,
                "| {mode} | {streams} | {} | {} | {} | {} | {} | {} | {} |",
                figure(peer, a),
                figure(ours, b),
                ratio(finished(b), finished(a)),
                ttft(a),
                ttft(b),
                equal(a),
                equal(b)
            );
        }
    }
}

/// The whole report as Markdown: a header naming the run, then each model.
pub fn markdown(report: &Report) -> String {
    let mut out = format!(
        "## {} on {} ({})\n\n- command: `{}`\n- TensorFold {}; {}\n\n",
        report.backend,
        report.machine,
        report.date,
        report.command,
        report.tensorfold_version,
        report.peer_version
    );
    for model in &report.models {
        out.push_str(&tables(model));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(streams: usize, rate: f64, equal: usize, failed: usize) -> Level {
        Level {
            streams,
            aggregate_tokens_per_s: rate,
            ttft_p50_s: 0.1,
            ttft_p95_s: 0.2,
            equal_to_solo: equal,
            failed,
            timed_out: failed == streams,
            wall_s: 150.0,
        }
    }

    #[test]
    fn tables_give_ratios_failures_and_the_solo_column() {
        let mut peer = EngineReport::new("llama.cpp");
        peer.cells.insert("tg128".into(), 100.0);
        peer.serving.insert(
            "greedy".into(),
            vec![level(1, 100.0, 1, 0), level(4, 300.0, 3, 0)],
        );
        let mut ours = EngineReport::new("TensorFold");
        ours.cells_error = Some("tensorfold bench failed\ndetails".into());
        ours.serving.insert(
            "greedy".into(),
            vec![level(1, 150.0, 1, 0), level(4, 0.0, 0, 4)],
        );
        let model = ModelReport {
            name: "m".into(),
            file: "m.gguf".into(),
            bytes: 1_000_000,
            cells: vec!["tg128".into()],
            engines: vec![peer, ours],
        };
        let text = tables(&model);
        assert!(text.contains("| tg128 | 100.0 | failed: tensorfold bench failed | – |"));
        assert!(text.contains("| greedy | 1 | 100.0 | 150.0 | 1.50x |"));
        assert!(text.contains("| greedy | 4 | 300.0 | no answer in 150 s | – |"));
        assert!(text.contains("| 3/4 | 0/4 (4 failed) |"));
    }

    #[test]
    fn the_session_table_gives_turns_sums_growth_and_equal_replies() {
        use crate::peer::session::Turn;
        let turn = |s: f64, reply: &str| Turn {
            ttft_s: s,
            prompt_tokens: None,
            cached_tokens: None,
            reply: reply.into(),
        };
        let mut peer = EngineReport::new("llama.cpp");
        peer.session = Some(Session {
            turns: vec![turn(1.0, "a"), turn(2.0, "b")],
            error: None,
        });
        let mut ours = EngineReport::new("TensorFold");
        ours.session = Some(Session {
            turns: vec![turn(0.5, "a"), turn(0.6, "c")],
            error: None,
        });
        let model = ModelReport {
            name: "m".into(),
            file: "m.gguf".into(),
            bytes: 0,
            cells: Vec::new(),
            engines: vec![peer, ours],
        };
        let text = tables(&model);
        assert!(
            text.contains("| turn 1 | 1.00 | 0.50 | 0.50x | yes |"),
            "{text}"
        );
        assert!(
            text.contains("| turn 2 | 2.00 | 0.60 | 0.30x | no |"),
            "{text}"
        );
        assert!(
            text.contains("| sum | 3.00 | 1.10 | 0.37x | 1/2 |"),
            "{text}"
        );
        assert!(
            text.contains("| last turn / first | 2.00x | 1.20x |"),
            "{text}"
        );
    }

    #[test]
    fn a_peer_that_could_not_be_built_says_so_in_every_cell() {
        let mut peer = EngineReport::new("llama.cpp");
        peer.error = Some("could not be built: cmake failed".into());
        let mut ours = EngineReport::new("TensorFold");
        ours.cells.insert("pp512".into(), 400.0);
        let model = ModelReport {
            name: "m".into(),
            file: "m.gguf".into(),
            bytes: 0,
            cells: vec!["pp512".into()],
            engines: vec![peer, ours],
        };
        assert!(tables(&model)
            .contains("| pp512 | failed: could not be built: cmake failed | 400.0 | – |"));
    }
}
