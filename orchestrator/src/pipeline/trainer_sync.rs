//! Keeping the trainer in step with Postgres: checkpoints, train requests that survive a trainer
//! restart, waiting for a dead trainer, and bringing a (re)started trainer to the last completed
//! step (restore from the newest checkpoint, replay the stored batches after it).

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Pipeline, PipelineError, Shared};
use crate::infra::db::{self};
use crate::infra::llm::trainer::TrainReply;

impl Pipeline {
    pub(super) async fn checkpoint(&self, s: i32) -> Result<(), PipelineError> {
        let sub = format!("{}/{}", self.cfg.checkpoint_subdir, self.run_id);
        let path = self.trainer.checkpoint(&sub).await?;
        db::pipeline::record_checkpoint(
            &self.pool,
            self.run_id,
            &db::pipeline::CheckpointRow {
                step: s,
                policy_version: s + 1,
                kind: if self.trainer_mode == wire::api::TrainMode::Lora {
                    "lora".into()
                } else {
                    "full".into()
                },
                path,
            },
            &serde_json::json!({
                "trainer": self.trainer.url(),
                "schedule": {"seed": self.seed, "tasks_per_step": self.tasks_per_step, "next_step": s + 1},
                "curriculum": self.slot(s + 1).map(|x| serde_json::json!({
                    "window": x.window,
                    "phase": if x.phase == crate::domain::schedule::Phase::New { "new" } else { "replay" },
                    "batch": x.batch,
                    "k": self.memory.as_ref().map(|m| m.window),
                })),
                "bank_items": self.memory.as_ref().map(|m| m.reflector.bank.len()),
            }),
        )
        .await?;
        Ok(())
    }

    pub(super) async fn train_with_recovery(
        &self,
        s: i32,
        batch: &wire::Batch,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<TrainReply, PipelineError> {
        loop {
            match self
                .trainer
                .train_step(batch, i64::from(s), Some(&self.settings_hash))
                .await
            {
                Ok(r) => return Ok(r),
                Err(e) if e.is_transient() => {
                    tracing::warn!(step = s, error = %e, "train step failed; waiting for the trainer");
                    self.wait_for_trainer(cancel).await?;
                    self.sync_trainer(s, shared, cancel).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(super) async fn wait_for_trainer(
        &self,
        cancel: &CancellationToken,
    ) -> Result<(), PipelineError> {
        let t0 = Instant::now();
        let limit = Duration::from_secs(self.cfg.trainer_wait_secs);
        while t0.elapsed() < limit {
            if self.trainer.health().await {
                return Ok(());
            }
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
        Err(PipelineError::TrainerGone {
            url: self.trainer.url().to_string(),
            waited_secs: self.cfg.trainer_wait_secs,
        })
    }

    /// Make the trainer hold this run's optimisation settings. A structural change (LoRA shape,
    /// full fine-tune, reference, parameter dtype) is only possible at version 0, so a trainer
    /// at another version is first reset to its model as started; `sync_trainer` then restores
    /// this run's weights. The echoed settings are stored with the run.
    pub(super) async fn apply_trainer_settings(
        &self,
        cancel: &CancellationToken,
    ) -> Result<(), PipelineError> {
        let run = self.run_id.to_string();
        let mut reset = false;
        loop {
            match self.trainer.apply_settings(&self.trainer_settings).await {
                Ok(reply) => {
                    db::pipeline::record_trainer_settings(
                        &self.pool,
                        self.run_id,
                        &serde_json::to_value(&reply.settings).unwrap_or_default(),
                        &reply.hash,
                    )
                    .await?;
                    tracing::info!(hash = %reply.hash, rebuilt = reply.rebuilt, "trainer settings applied");
                    return Ok(());
                }
                Err(e) if e.is_transient() => self.wait_for_trainer(cancel).await?,
                Err(crate::infra::llm::trainer::TrainerError::Conflict { .. }) if !reset => {
                    reset = true;
                    self.trainer.restore(None, &run).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Bring the trainer to policy version `target` (= steps 0..target trained) for this run,
    /// holding this run's settings.
    pub(super) async fn sync_trainer(
        &self,
        target: i32,
        shared: &Shared,
        cancel: &CancellationToken,
    ) -> Result<(), PipelineError> {
        let run = self.run_id.to_string();
        self.apply_trainer_settings(cancel).await?;
        loop {
            let st = match self.trainer.state().await {
                Ok(st) => st,
                Err(e) if e.is_transient() => {
                    self.wait_for_trainer(cancel).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if st.session.as_deref() == Some(run.as_str())
                && st.policy_version == wire::PolicyVersion::from(target)
            {
                return Ok(());
            }
            let ck = if target > 0 {
                db::pipeline::latest_checkpoint(&self.pool, self.run_id, target - 1).await?
            } else {
                None
            };
            tracing::info!(
                run = %run,
                trainer_session = ?st.session,
                trainer_version = %st.policy_version,
                target,
                checkpoint = ?ck.as_ref().map(|c| &c.path),
                "restoring the trainer"
            );
            let restored = match self
                .trainer
                .restore(ck.as_ref().map(|c| c.path.as_str()), &run)
                .await
            {
                Ok(r) => r,
                Err(e) if e.is_transient() => {
                    self.wait_for_trainer(cancel).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            // The name the servers serve the policy under: the restored version's adapter when
            // the trainer publishes LoRA, then each replayed step's; else their plain name.
            let mut served = restored.published_name;
            let mut failed = None;
            for r in restored.policy_version.get() as i32..target {
                let (b, _, _) = self.build_batch(r, false).await?;
                match self
                    .trainer
                    .train_step(&b, i64::from(r), Some(&self.settings_hash))
                    .await
                {
                    Ok(reply) => {
                        if let Some(name) =
                            crate::infra::llm::trainer::published_name(reply.published.as_ref())
                        {
                            served = Some(name);
                        }
                        shared
                            .replayed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) if e.is_transient() => {
                        failed = Some(e);
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            match failed {
                None => {
                    if let Ok(mut g) = shared.model.write() {
                        *g = served;
                    }
                    return Ok(());
                }
                Some(e) => {
                    tracing::warn!(error = %e, "replay interrupted; waiting for the trainer");
                    self.wait_for_trainer(cancel).await?;
                }
            }
        }
    }
}
