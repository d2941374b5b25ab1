//! The one-stream cells (prefill, decode, decode at depth) of both engines:
//! `llama-bench` and `tensorfold bench`, each printing JSON.

use super::llama_cpp::LlamaCpp;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

/// Which cells, and how often each is timed.
pub struct CellSpec {
    pub prefill: Vec<usize>,
    pub decode: usize,
    pub depths: Vec<usize>,
    pub repetitions: usize,
}

/// Tokens/s by cell name (`pp512`, `tg128`, `tg128@d8192`), medians.
pub type Figures = BTreeMap<String, f64>;

pub fn cell_name(n_prompt: usize, n_gen: usize, n_depth: usize) -> String {
    match (n_gen, n_depth) {
        (0, _) => format!("pp{n_prompt}"),
        (n, 0) => format!("tg{n}"),
        (n, d) => format!("tg{n}@d{d}"),
    }
}

/// The cell names `spec` asks for, in table order.
pub fn names(spec: &CellSpec) -> Vec<String> {
    let mut names = vec![cell_name(0, spec.decode, 0)];
    names.extend(spec.depths.iter().map(|&d| cell_name(0, spec.decode, d)));
    names.extend(spec.prefill.iter().map(|&p| cell_name(p, 0, 0)));
    names
}

/// llama-bench on `model`: one run for prefill and plain decode, one for
/// decode at depth.
pub fn llama_bench(
    llama: &LlamaCpp,
    model: &Path,
    backend: &str,
    spec: &CellSpec,
    log: &Path,
) -> Result<Figures> {
    let mut runs = vec![(join(&spec.prefill), "0".to_string())];
    if !spec.depths.is_empty() {
        runs.push(("0".to_string(), join(&spec.depths)));
    }
    let mut figures = Figures::new();
    for (prompts, depths) in runs {
        let mut command = Command::new(llama.tool("llama-bench"));
        command
            .arg("-m")
            .arg(model)
            .args([
                "-p",
                &prompts,
                "-n",
                &spec.decode.to_string(),
                "-d",
                &depths,
            ])
            .args(["-r", &spec.repetitions.to_string(), "-o", "json"]);
        match backend {
            "cuda" => command.args(["-ngl", "99", "-fa", "1"]),
            _ => command.args(["-ngl", "0", "-t", &threads().to_string()]),
        };
        let out = capture(&mut command, log)?;
        let rows: Vec<Value> = serde_json::from_str(&out)
            .with_context(|| format!("llama-bench printed no JSON; see {log:?}"))?;
        for row in rows {
            let field = |k: &str| row[k].as_u64().unwrap_or(0) as usize;
            let (p, n, d) = (field("n_prompt"), field("n_gen"), field("n_depth"));
            if p > 0 && n > 0 {
                continue;
            }
            let samples: Vec<f64> = row["samples_ts"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            let rate = median(&samples).or(row["avg_ts"].as_f64());
            if let Some(rate) = rate {
                figures.insert(cell_name(p, n, d), rate);
            }
        }
    }
    Ok(figures)
}

/// `tensorfold bench` on `model`: one JSON line a cell. Cells it could not
/// run come back in `errors`, by name.
pub fn tensorfold_bench(
    bin: &Path,
    model: &Path,
    backend: &str,
    spec: &CellSpec,
    log: &Path,
    errors: &mut BTreeMap<String, String>,
) -> Result<Figures> {
    let mut depths = vec![0];
    depths.extend(&spec.depths);
    let out = capture_all(
        Command::new(bin)
            .arg("bench")
            .arg(model)
            .args(["-p", &join(&spec.prefill), "-n", &spec.decode.to_string()])
            .args(["-d", &join(&depths), "-r", &spec.repetitions.to_string()])
            .args(["--backend", backend]),
        log,
    )?;
    let mut figures = Figures::new();
    for line in out.lines().filter(|l| l.starts_with('{')) {
        let cell: Value = serde_json::from_str(line)?;
        let Some(test) = cell["test"].as_str() else {
            continue;
        };
        if let Some(rate) = cell["tokens_per_s"].as_f64() {
            figures.insert(test.to_string(), rate);
        }
        if let Some(error) = cell["error"].as_str() {
            errors.insert(test.to_string(), error.to_string());
        }
    }
    if figures.is_empty() && errors.is_empty() {
        bail!("tensorfold bench measured nothing; see {log:?}");
    }
    Ok(figures)
}

/// Runs `command`; returns its stdout whatever its exit status (a failed
/// cell is reported on stdout), its stderr going to `log`.
fn capture_all(command: &mut Command, log: &Path) -> Result<String> {
    let out = run_logged(command, log)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `command`; returns its stdout, its stderr going to `log`.
fn capture(command: &mut Command, log: &Path) -> Result<String> {
    let out = run_logged(command, log)?;
    if !out.status.success() {
        let program = command.get_program();
        bail!("{program:?} failed ({}); see {log:?}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_logged(command: &mut Command, log: &Path) -> Result<std::process::Output> {
    let err = std::fs::File::create(log)?;
    command
        .stdin(Stdio::null())
        .stderr(err)
        .output()
        .with_context(|| format!("starting {:?}", command.get_program()))
}

/// `[512, 2048]` as `512,2048`, as both tools take lists.
fn join(values: &[usize]) -> String {
    let items: Vec<String> = values.iter().map(usize::to_string).collect();
    items.join(",")
}

pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn median(samples: &[f64]) -> Option<f64> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_named_as_llama_bench_names_them() {
        assert_eq!(cell_name(512, 0, 0), "pp512");
        assert_eq!(cell_name(0, 128, 0), "tg128");
        assert_eq!(cell_name(0, 128, 8192), "tg128@d8192");
        let spec = CellSpec {
            prefill: vec![512, 2048],
            decode: 128,
            depths: vec![2048],
            repetitions: 1,
        };
        assert_eq!(names(&spec), ["tg128", "tg128@d2048", "pp512", "pp2048"]);
    }

    #[test]
    fn medians_take_the_middle_sample() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }
}
