//! Tokenizer and chat template of a Hugging Face model directory (`tokenizer.json`,
//! `tokenizer_config.json`), rendering exactly what Python transformers renders. This module is
//! the door to the `tokenizers` crate; `template` is the door to minijinja for chat templates.

mod template;
mod tokenizer;

pub use crate::domain::scaffold::{AnswerFormat, Scaffold, ToolSpec};
pub use template::{ChatTemplate, TemplateError, python_json};
pub use tokenizer::{ModelTokenizer, TokenizerError};
