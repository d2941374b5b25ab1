//! `tensorfold`: run a prompt, inspect a model, serve the OpenAI API,
//! quantize a model, time it; pull, list and remove hub models.

mod bench;
mod cli;
mod hub;
mod quantize;
mod run;
mod serve;
mod synth;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    let result = match args.command {
        cli::Command::Run(a) => run::run(a),
        cli::Command::Info(a) => run::info(a),
        cli::Command::Serve(a) => serve::serve(a),
        cli::Command::Quantize(a) => quantize::quantize(a),
        cli::Command::Synth(a) => synth::synth(a),
        cli::Command::Bench(a) => bench::bench(a),
        cli::Command::Pull(a) => hub::pull(a),
        cli::Command::Ls(a) => hub::ls(a),
        cli::Command::Rm(a) => hub::rm(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
