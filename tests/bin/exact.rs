//! `cargo xtask exact`: the whole exactness suite, as a table.

fn main() {
    let fast = std::env::args().any(|a| a == "--fast");
    println!("{:<60} {:>6} {:>8}  result", "case", "tokens", "tok/rnd");
    let outcomes = tensorfold_tests::exact::run(!fast, &mut |o| {
        let result = if o.identical { "identical" } else { "DIFFERS" };
        println!(
            "{:<60} {:>6} {:>8.2}  {result}",
            o.case, o.tokens, o.tokens_per_round
        );
    });
    let same = outcomes.iter().filter(|o| o.identical).count();
    println!("exact: {same}/{} cases identical", outcomes.len());
    if same != outcomes.len() {
        std::process::exit(1);
    }
}
