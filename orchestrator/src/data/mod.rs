//! Task sources: the generated research world (offline), and (as they land) task files in our
//! JSONL format or DR Tulu's RL rows.

pub mod tasks;
pub mod world;
