//! Claims on exact keys, for single flight across replicas that share a store: the replica that
//! claims a key asks the upstream for it, the others wait for its answer in the store. A claim is
//! a lease that lapses unless renewed, so a replica that dies holds the others up only briefly.
//! Claims must never block a request: a store that fails to claim grants the claim (fail-open).

/// Proof of a held claim, needed to renew and release it: no other replica's token does either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimToken(pub String);

/// What claiming an exact key gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This replica holds the claim: it asks the upstream, renews the claim while it does, and
    /// releases it when its answer is stored (or will not be).
    Led(ClaimToken),
    /// Another replica holds it: its answer will be in the store once its flight lands.
    Elsewhere,
    /// No other process can hold one (the store is not shared, or is down): go ahead; there is
    /// nothing to renew or release.
    Local,
}
