pub mod browser;
pub mod fake_deeprubric;
pub mod fake_grader;
pub mod fake_judge;
pub mod fake_openai;
pub mod fixtures;
pub mod kill;
pub mod loopback;
