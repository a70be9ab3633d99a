//! Usage errors as one line on stderr, exit 64: clap's error (a message,
//! a usage section, a tip) becomes `fencelock: <what is wrong> (see
//! fencelock <COMMAND> --help)`, naming the help page that explains the
//! argument. One line, so that a script's log says what went wrong.

use clap::CommandFactory;

use crate::cli::Cli;
use crate::{exit, redact};

/// What a failed parse does; its exit code. clap reports `--help` and
/// `--version` as errors too: they print their page and exit 0.
pub(crate) fn report(e: &clap::Error) -> u8 {
    if e.use_stderr() {
        eprintln!("{}", redact::scrub(&usage_line(e)));
        exit::USAGE
    } else {
        let _ = e.print();
        exit::OK
    }
}

/// A clap usage error as one line that names what is wrong and where to look:
/// `fencelock: missing required argument <NAME> (see fencelock run --help)`.
fn usage_line(e: &clap::Error) -> String {
    let message = if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let names: Vec<String> = <Cli as CommandFactory>::command()
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name().to_string())
            .collect();
        format!("no command given: use one of {}", names.join(", "))
    } else {
        error_message(&e.render().to_string())
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("fencelock: {message} (see {} --help)", command_path(&args))
}

/// clap's message, with the arguments it lists on the lines after a heading
/// that ends with `:` (the missing ones, for instance) on the same line.
fn error_message(rendered: &str) -> String {
    let mut lines = rendered.lines().map(str::trim_end);
    let first = lines
        .by_ref()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid usage")
        .trim_start_matches("error: ");
    let mut items = Vec::new();
    if first.ends_with(':') {
        items.extend(
            lines
                .take_while(|l| l.starts_with(char::is_whitespace) && !l.trim().is_empty())
                .map(str::trim),
        );
    }
    match (first, items.as_slice()) {
        ("the following required arguments were not provided:", [one]) => {
            format!("missing required argument {one}")
        }
        ("the following required arguments were not provided:", many) if !many.is_empty() => {
            format!("missing required arguments {}", many.join(", "))
        }
        (first, []) => first.to_string(),
        (first, items) => format!("{} {}", first.trim_end_matches(':'), items.join(", ")),
    }
}

/// `fencelock SUBCOMMAND` if the command line names one, else `fencelock`:
/// the help page that explains the error.
fn command_path(args: &[String]) -> String {
    let command = <Cli as CommandFactory>::command();
    // Global options that take a separate value (`--prefix run` names no
    // subcommand).
    let with_value: Vec<String> = command
        .get_arguments()
        .filter(|a| a.get_action().takes_values() && !a.is_positional())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    let mut skip = false;
    for arg in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if arg == "--" {
            break;
        }
        if with_value.contains(arg) {
            skip = true;
            continue;
        }
        if let Some(sub) = command
            .get_subcommands()
            .find(|c| c.get_name() == arg && !c.is_hide_set())
        {
            return format!("fencelock {}", sub.get_name());
        }
    }
    "fencelock".to_string()
}

#[cfg(test)]
mod tests {
    use super::{command_path, error_message};

    #[test]
    fn usage_lines_name_the_argument_and_the_command() {
        let rendered = "error: the following required arguments were not provided:\n  <NAME>\n\nUsage: fencelock run --ttl <DURATION> <NAME> [-- <CMD>...]\n\nFor more information, try '--help'.\n";
        assert_eq!(error_message(rendered), "missing required argument <NAME>");
        let rendered = "error: the following required arguments were not provided:\n  --fence <N>\n  <VALUE>\n\nUsage: fencelock write <RESOURCE> <VALUE>\n";
        assert_eq!(
            error_message(rendered),
            "missing required arguments --fence <N>, <VALUE>"
        );
        assert_eq!(
            error_message("error: unexpected argument '--x' found\n\n  tip: ...\n"),
            "unexpected argument '--x' found"
        );
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            command_path(&args(&["--prefix", "run", "status"])),
            "fencelock status"
        );
        assert_eq!(
            command_path(&args(&["--ttl", "1s", "run"])),
            "fencelock run"
        );
        assert_eq!(command_path(&args(&["bogus", "--", "run"])), "fencelock");
    }
}
