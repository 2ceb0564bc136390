//! Reprise client library: the simulated upstream (`sim`) and the benchmark driver (`bench`).
//!
//! The crate talks to a gateway only over HTTP and never links the server, so it can measure any
//! OpenAI-compatible endpoint the same way.

pub mod bench;
pub mod sim;
