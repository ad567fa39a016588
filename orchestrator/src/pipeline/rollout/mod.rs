//! Rollouts: the multi-turn token-in/token-out loop with tools (`engine`), the token codec it
//! uses (`codec`), and batches of n rollouts per task across tasks with bounded concurrency and
//! cancellation (`batch`).

pub mod admission;
pub mod batch;
pub mod codec;
pub mod engine;

pub use admission::Admission;
pub use batch::{
    RolloutSummary, rollout_batch, rollout_batch_gated, rollout_batch_pooled,
    rollout_batch_summary, summarize,
};
pub use codec::{CodecError, TokenCodec};
pub use engine::{
    ExecutedCall, Rollout, RolloutCtx, RolloutError, RolloutSlot, RolloutTask, STOPS, TEACHER,
};
