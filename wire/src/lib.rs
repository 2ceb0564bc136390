//! The wire contract between the gateway and its client: the words and bodies the server
//! serializes and the client decodes. It holds types and their spellings only: no I/O, no
//! clock, no server logic, and it must never depend on `reprise-server` or `reprise-client`.
//!
//! - [`outcome`]: what the cache did ([`CacheOutcome`]) and how a response ended ([`Completion`]);
//! - [`lenient`]: [`Lenient`], how a reader keeps a spelling it does not know;
//! - [`phases`]: the [`Phases`] of one request and their two text forms (`Server-Timing` and the
//!   stream's timing comment);
//! - [`record`]: the [`RequestRecord`] of `GET /admin/requests`;
//! - [`stats`]: the parts of the `GET /admin/stats` body that count requests;
//! - [`judge`]: the judge's work and the error budget's evidence ([`JudgeStats`]);
//! - [`savings`]: the tokens and money hits saved ([`TokensSaved`] per request, [`Savings`] summed).
//!
//! Decoding is lenient so that a client reads an older or a newer gateway: unknown fields are
//! ignored, missing ones take their default, and an outcome the client does not know is kept as
//! [`Lenient::Unknown`] in a [`LenientRecord`]. Encoding is exactly what the gateway sends.

pub mod judge;
pub mod lenient;
pub mod outcome;
pub mod phases;
pub mod record;
pub mod savings;
pub mod stats;

pub use judge::{JudgeStats, NamespaceBudget};
pub use lenient::Lenient;
pub use outcome::{CacheOutcome, Completion};
pub use phases::Phases;
pub use record::{LenientRecord, RequestRecord};
pub use savings::{JudgeCost, PriceTableInfo, Savings, SavingsRow, TokenSource, TokensSaved};
pub use stats::{
    GuardRefusals, OutcomeLatency, Overlap, Rates, RequestCounts, Summary, Timeline,
    TimelineBucket, TtftHistogram, TtftSaved, UpstreamErrors,
};
