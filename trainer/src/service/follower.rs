//! A data-parallel rank other than 0 under `trainer serve`: no HTTP, it takes rank 0's
//! commands from the group's store in order: step shares ([`Trainer::run_received`]), and the
//! policy replacements rank 0 made through its API ([`Control`]: restore, settings), applied
//! to this rank's copy the same way so every rank keeps identical weights and optimizer state.
//! Idle time between steps is normal; a store that stops answering within the group's timeout
//! means rank 0 is gone or out of reach, and the rank exits with that error, or the store
//! watchdog (`dist::watchdog`, under every store call of the group) ends it where c10d's store
//! client would block (the launcher then stops the job).
//!
//! [`Trainer::run_received`]: crate::train::Trainer::run_received

use std::time::Duration;

use super::Policy;
use super::load::{self, LoadOptions};
use crate::dist::data_parallel::{self, Control};
use crate::error::{Result, TrainerError};

/// How long one wait for the next command lasts before the store is probed.
const POLL: Duration = Duration::from_secs(5);

/// Follow rank 0 until the group ends (an error: rank 0 gone, a failed share).
pub fn follow(mut policy: Policy, mut opts: LoadOptions) -> Result<()> {
    let rank = policy.trainer.collective().map_or(0, |g| g.rank());
    tracing::info!(rank, "following rank 0");
    loop {
        let cmd = {
            let Some(g) = policy.trainer.collective() else {
                return Err(TrainerError::Config("a follower needs its group".into()));
            };
            match data_parallel::receive(g, POLL) {
                Ok(cmd) => cmd,
                Err(wait) => {
                    // No command yet, or rank 0 (which hosts the store) is gone: a round trip
                    // tells the two apart. A write alone does not: the store's client does not
                    // wait for its answer, so across a network partition (no peer closes the
                    // connection) it succeeds into the socket's buffer; the read back answers
                    // within the group's timeout, fails, or trips the store watchdog.
                    let key = format!("alive/rank/{rank}");
                    let probe = g
                        .set(&key, b"1")
                        .and_then(|()| g.get(&key, g.timeout()).map(drop));
                    if let Err(probe) = probe {
                        return Err(TrainerError::Config(format!(
                            "rank {rank}: rank 0 stopped answering ({wait}; {probe})"
                        )));
                    }
                    continue;
                }
            }
        };
        match cmd.control.clone() {
            None => {
                policy.trainer.run_received(cmd)?;
            }
            Some(Control::Restore { checkpoint }) => {
                replace(&mut policy, &opts, checkpoint.as_deref())?;
                if let Some(ck) = &checkpoint {
                    load::restore_sharded_optimizer(&mut policy, ck)?;
                }
                tracing::info!(rank, checkpoint = ?checkpoint, "policy restored");
            }
            Some(Control::Settings { settings }) => {
                let new: wire::TrainSettings = serde_json::from_value(settings)
                    .map_err(|e| TrainerError::Config(format!("settings from rank 0: {e}")))?;
                if policy.settings.structural_change(&new) {
                    opts.settings = new;
                    replace(&mut policy, &opts, None)?;
                } else {
                    policy.apply_live_settings(&new)?;
                    opts.settings = new;
                }
                tracing::info!(rank, hash = %policy.settings.hash(), "settings applied");
            }
            Some(Control::SaveShard { dir, key }) => {
                let r = policy.trainer.save_zero(&dir);
                let status = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e.to_string(),
                };
                if let Some(g) = policy.trainer.collective() {
                    g.set(&format!("{key}/done/{rank}"), status.as_bytes())?;
                }
                r?;
            }
        }
    }
}

/// Rebuild the policy as rank 0 did, keeping this rank's place in the group.
fn replace(
    policy: &mut Policy,
    opts: &LoadOptions,
    checkpoint: Option<&std::path::Path>,
) -> Result<()> {
    let mut fresh = load::build_policy(opts, checkpoint)?;
    let zero = policy.trainer.zero_stage();
    if let Some(g) = policy.trainer.take_collective() {
        fresh.trainer.set_collective(g);
    }
    fresh.trainer.set_zero(zero)?;
    *policy = fresh;
    Ok(())
}
