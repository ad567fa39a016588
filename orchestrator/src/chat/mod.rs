//! Tokenizer and chat template of a Hugging Face model directory (`tokenizer.json`,
//! `tokenizer_config.json`), rendering exactly what Python transformers renders. This module is
//! the door to the `tokenizers` crate; `template` is the door to minijinja for chat templates.

pub mod prompts;
mod template;
mod tokenizer;

pub use prompts::{AnswerFormat, Scaffold, ToolSpec, system_prompt, user_message};
pub use template::{ChatTemplate, TemplateError, python_json};
pub use tokenizer::{ModelTokenizer, TokenizerError};
