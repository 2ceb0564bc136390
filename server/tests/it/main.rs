//! The server's integration tests, one binary: router tests through `oneshot` (`router`, `fuzz`),
//! the real gateway on an ephemeral port in front of `reprise-sim` (in process), and the `reprise`
//! binary as a process.

// server/clippy.toml bans bare spawns in the gateway; a test may spawn its clients and servers.
#![allow(
    clippy::disallowed_methods,
    reason = "tests spawn clients and servers beside the code under test; none of it must outlive the test"
)]

mod admin;
mod cache;
mod cluster;
mod common;
mod conn;
mod disk;
mod feed;
mod fuzz;
mod gateway;
mod layers;
mod learn;
mod messages;
mod model_change;
mod otel;
mod process;
mod redis;
mod responses;
mod router;
mod savings;
mod semantic;
mod slow_store;
mod store_contract;
mod tenants;
mod upstream;
mod verify;
