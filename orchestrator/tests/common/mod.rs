pub mod fake_judge;
pub mod fake_openai;
pub mod fixtures;
