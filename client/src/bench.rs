//! Benchmark driver (filled in below).
