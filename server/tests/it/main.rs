//! The server's integration tests, one binary: the real gateway on an ephemeral port in front of
//! `reprise-sim` (in process), and the `reprise` binary as a process.

mod admin;
mod cache;
mod common;
mod conn;
mod disk;
mod fuzz;
mod gateway;
mod learn;
mod otel;
mod process;
mod semantic;
mod upstream;
