//! The trait every API adapter implements. Kept apart from `api/mod.rs`, which picks an adapter
//! per route, so that the adapters and their lookup do not import each other; it must not name
//! any one adapter.

use serde_json::{Map, Value};

use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{FieldHasher, Turn};
use crate::policy::Policy;

/// One API's rules, as the stages need them.
pub trait Api: Sync {
    /// The route this adapter serves.
    fn route(&self) -> Route;

    /// Keys: writes the body's answer-changing fields into the partition and returns the final
    /// turn (the exact part and the prompt semantic matching compares). Fails (400, naming the
    /// field) when a field the keys depend on has the wrong JSON type.
    fn turn(
        &self,
        body: &Map<String, Value>,
        partition: &mut FieldHasher,
    ) -> Result<Turn, GatewayError>;

    /// The API's own cache rules read from the request body, applied to `policy` (a request that
    /// is never cached turns lookup and store off); returns whether its entry may be shared across
    /// API keys when the operator shares them.
    fn rules(&self, _body: &Map<String, Value>, _policy: &mut Policy) -> bool {
        true
    }
}
