//! The subcommands, one module each, laid out like cargo's commands: a
//! module holds its subcommand's arguments (the `…Args` struct, whose doc
//! comments are the subcommand's `--help`) beside `exec`, the function that
//! carries it out. [`crate::cli::Command`] lists the subcommands and `main`
//! calls their `exec`.
//!
//! A command imports only what lives beside `commands/` (the global
//! options, shared argument values, the connection, exit codes, child
//! processes, the private servers), never another command, `cli` or
//! `main`: so no file imports one that imports it back.

pub(crate) mod bench;
pub(crate) mod demo;
pub(crate) mod doctor;
pub(crate) mod read;
pub(crate) mod revoke;
pub(crate) mod run;
pub(crate) mod status;
pub(crate) mod top;
pub(crate) mod torture;
pub(crate) mod update;
pub(crate) mod write;
