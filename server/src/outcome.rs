//! The words every floor uses for how a request ended: what the cache did ([`CacheOutcome`], one
//! spelling on the wire, in stats, metrics and the client) and how the response reached the client
//! ([`Completion`]). Ground floor: imports nothing of the crate. The enums live in the wire
//! contract (`reprise-wire`), which the client reads too; they stay exhaustive for the server's
//! matches.

pub use reprise_wire::{CacheOutcome, Completion};
