//! What a channel needs from the broker, and nothing more: the desktop prompts and the CLI
//! socket decide requests and read the table through [`Decider`], so they never name the
//! broker (which starts them), and the broker's state stays its own.

use std::sync::Arc;

use super::{AskKind, BrokerConfig, Decision, Operator, PendingInfo};

/// The broker as a channel sees it. Implemented by the broker's shared state.
pub(crate) trait Decider: Send + Sync {
    /// The configuration the broker was started with (owner uid, mountpoint, timeout).
    fn config(&self) -> &BrokerConfig;

    /// Decides request `id`; false if it is unknown, already decided or timed out. Returns
    /// as soon as the decision is taken: the request's callback runs on the broker's resume
    /// pool, not on the deciding channel's thread.
    fn decide(&self, id: u64, d: Decision) -> bool;

    /// The pending requests, oldest first.
    fn pending(&self) -> Vec<PendingInfo>;

    /// The kind and intent of a pending request, for validating a grant before deciding.
    fn peek(&self, id: u64) -> Option<(AskKind, Option<String>)>;

    /// Resets the circuit breaker of `identity` (and closes its desktop trip notice).
    /// `None`: no reset hook is installed; `Some(false)`: no such identity.
    fn reset(&self, identity: &str) -> Option<bool>;

    /// What serves the operator's other requests on the control socket, once installed.
    fn operator(&self) -> Option<Arc<dyn Operator>>;
}
