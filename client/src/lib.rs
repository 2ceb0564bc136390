//! Reprise client library: the simulated upstream (`sim`), the benchmark driver (`bench`) and the
//! match-quality evaluation (`eval`).
//!
//! The crate talks to a gateway only over HTTP and never links the server, so it can measure any
//! OpenAI-compatible endpoint the same way.

pub mod bench;
pub mod eval;
pub mod sim;
