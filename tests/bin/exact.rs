//! `cargo xtask exact`: the whole exactness suite, as a table.
//! `--fast`: the subset CI runs; `--backend cpu|cuda`: where the target runs;
//! `--subject NAME`: only the models whose name contains NAME.

use tensorfold_engine::BackendChoice;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fast = args.iter().any(|a| a == "--fast");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .map(|i| match args.get(i + 1) {
                Some(v) => v.as_str(),
                None => exit_with(&format!("{flag} needs a value")),
            })
    };
    let backend = match value("--backend").map(str::parse::<BackendChoice>) {
        Some(Ok(b)) => b,
        Some(Err(e)) => exit_with(&e),
        None => BackendChoice::Cpu,
    };
    let only = value("--subject").unwrap_or("");
    println!("{:<60} {:>6} {:>8}  result", "case", "tokens", "tok/rnd");
    let report = tensorfold_tests::exact::run_subjects(!fast, backend, only, &mut |o| {
        let result = if o.identical { "identical" } else { "DIFFERS" };
        println!(
            "{:<60} {:>6} {:>8.2}  {result}",
            o.case, o.tokens, o.tokens_per_round
        );
    });
    for (subject, why) in &report.skipped {
        println!("{subject:<60} skipped: {why}");
    }
    let outcomes = &report.outcomes;
    let same = outcomes.iter().filter(|o| o.identical).count();
    println!("exact: {same}/{} cases identical", outcomes.len());
    if same != outcomes.len() || outcomes.is_empty() {
        std::process::exit(1);
    }
}

fn exit_with(message: &str) -> ! {
    eprintln!("exact: {message}");
    std::process::exit(2);
}
