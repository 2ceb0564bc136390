//! Reprise client library: the typed admin API client (`admin`), the two APIs it drives (`api`), the admin subcommands of
//! `reprise-client` with their tables (`admin_cli`), the benchmark driver (`bench`), the
//! match-quality evaluation (`eval`) and a delaying TCP proxy for tests and benchmarks (`delay`).
//! The simulated upstream is its own crate, `reprise-sim`.
//!
//! The crate talks to a gateway only over HTTP and never links the server, so it can measure any
//! OpenAI-compatible endpoint the same way. The types both sides share (outcomes, phases, request
//! records, the stats counts) come from the small `reprise-wire` crate, which decodes leniently so
//! the client reads an older or newer gateway.

pub mod admin;
pub mod admin_cli;
pub mod api;
pub mod bench;
pub mod delay;
pub mod eval;
