//! The `trainer` binary. The libtorch trainer (Qwen3 in tch, SS-GRPO/GRPO/SFT losses, LoRA,
//! `trainer serve`) lands with its own work item; until then this binary only reports that.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "trainer {}: the libtorch trainer is not part of this build yet",
        env!("CARGO_PKG_VERSION")
    );
    ExitCode::from(2)
}
