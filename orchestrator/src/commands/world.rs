//! `orchestrator world generate`: write the offline research world (a corpus and multi-hop
//! tasks with rubrics), deterministic per seed.

use std::process::ExitCode;

use anyhow::Context;

use super::out;
use crate::cli::WorldCommand;

pub(super) fn world(cmd: WorldCommand) -> anyhow::Result<ExitCode> {
    let WorldCommand::Generate {
        seed,
        docs,
        tasks,
        held_out,
        out: dir,
    } = cmd;
    anyhow::ensure!(docs >= 4, "--docs = {docs} is too small; allowed: >= 4");
    anyhow::ensure!(
        docs <= 10_000_000,
        "--docs = {docs} is too large; allowed: <= 10000000"
    );
    anyhow::ensure!(
        tasks <= 1_000_000,
        "--tasks = {tasks} is too large; allowed: <= 1000000"
    );
    anyhow::ensure!(
        held_out <= 1_000_000,
        "--held-out = {held_out} is too large; allowed: <= 1000000"
    );
    let world = crate::domain::data::world::generate_split(seed, docs, tasks, held_out);
    anyhow::ensure!(
        world.held_out.len() == held_out,
        "--docs = {docs} gives too few lineages to hold any out; allowed: >= 11 with --held-out"
    );
    crate::domain::data::world::write(&world, &dir)
        .with_context(|| format!("writing the world to {}", dir.display()))?;
    out(format!(
        "world seed {seed}: {} documents, {} tasks, {} held out written to {}",
        world.docs.len(),
        world.tasks.len(),
        world.held_out.len(),
        dir.display()
    ));
    Ok(ExitCode::SUCCESS)
}
