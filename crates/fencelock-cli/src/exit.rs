//! Exit codes (docs/design.md §5) and one-line error messages.

/// Success.
pub(crate) const OK: u8 = 0;
/// The scenario or check did not hold.
pub(crate) const FAILED: u8 = 1;
/// `torture`: no violation found, but the checkers saw too little to judge
/// (inconclusive).
pub(crate) const INCONCLUSIVE: u8 = 2;
/// Bad command-line usage (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// Input data that cannot be used, e.g. a value that is not UTF-8 text
/// (EX_DATAERR).
pub(crate) const DATA: u8 = 65;
/// Redis unreachable or refused us (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// `run`: the command succeeded but its lock could not be released; it
/// stays held until its ttl runs out (EX_IOERR).
pub(crate) const RELEASE_FAILED: u8 = 74;
/// Internal failure (EX_SOFTWARE).
pub(crate) const SOFTWARE: u8 = 70;
/// Bad configuration, e.g. a missing redis-server (EX_CONFIG).
pub(crate) const CONFIG: u8 = 78;

/// An error that already knows its exit code.
#[derive(Debug)]
pub(crate) struct Exit {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// Builds an error with an explicit exit code.
pub(crate) fn fail(code: u8, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Exit {
        code,
        message: message.into(),
    })
}

/// Prints the error that ends the process on one line of stderr, scrubbed
/// of credentials; its exit code.
pub(crate) fn report(e: &anyhow::Error) -> u8 {
    eprintln!("fencelock: {}", crate::redact::scrub(&one_line(e)));
    code_for(e)
}

/// The exit code for an error: explicit codes first, then library errors.
fn code_for(e: &anyhow::Error) -> u8 {
    if let Some(exit) = e.downcast_ref::<Exit>() {
        return exit.code;
    }
    match e.downcast_ref::<fencelock::Error>() {
        // Wrong credentials, a missing ACL permission, a key of the wrong
        // type, a database that does not exist: configuration, not an outage.
        Some(err) if err.is_config() => CONFIG,
        Some(err) if err.is_connection() => UNAVAILABLE,
        Some(err) if err.is_invalid_input() => USAGE,
        _ => SOFTWARE,
    }
}

/// The error and its causes on one line.
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string().replace('\n', " ");
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}
