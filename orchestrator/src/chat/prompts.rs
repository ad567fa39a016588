//! Prompts are data under `prompts/`, embedded at build time and rendered with minijinja. This
//! file only selects and renders them; it holds no prompt prose.

use minijinja::Environment;
use serde::{Deserialize, Serialize};

use super::template::TemplateError;

/// Which agent scaffold the policy runs; baselines run on the same engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scaffold {
    /// Plan, Research, Review, Answer with self-rubrics (default).
    Rubricem,
    /// DR Tulu's think / call_tool / answer / cite grammar.
    Drtulu,
    /// Plain ReAct.
    React,
}

/// The response-format suffix appended to the user query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerFormat {
    Exact,
    Short,
    Long,
}

impl AnswerFormat {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "exact" | "exact_answer" => Some(Self::Exact),
            "short" | "short_form" => Some(Self::Short),
            "long" | "long_form" => Some(Self::Long),
            _ => None,
        }
    }
}

/// How a tool is advertised to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// Free text listing accepted attributes, e.g. `limit, year (2019-2024), fieldsOfStudy`.
    #[serde(default)]
    pub attributes: String,
}

const RUBRICEM: &str = include_str!("../../../prompts/agent/rubricem.jinja");
const DRTULU: &str = include_str!("../../../prompts/agent/drtulu.jinja");
const REACT: &str = include_str!("../../../prompts/agent/react.jinja");
const FORMAT_EXACT: &str = include_str!("../../../prompts/agent/format_exact.txt");
const FORMAT_SHORT: &str = include_str!("../../../prompts/agent/format_short.txt");
const FORMAT_LONG: &str = include_str!("../../../prompts/agent/format_long.txt");

/// The system prompt for a scaffold with its tools and call budget.
pub fn system_prompt(
    scaffold: Scaffold,
    tools: &[ToolSpec],
    max_tool_calls: u32,
) -> Result<String, TemplateError> {
    let source = match scaffold {
        Scaffold::Rubricem => RUBRICEM,
        Scaffold::Drtulu => DRTULU,
        Scaffold::React => REACT,
    };
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    let tmpl = env
        .template_from_str(source)
        .map_err(|e| TemplateError::Compile(e.to_string()))?;
    tmpl.render(minijinja::context! { tools => tools, max_tool_calls => max_tool_calls })
        .map(|s| s.trim_end().to_string())
        .map_err(|e| TemplateError::Render(e.to_string()))
}

/// The user turn: the query followed by its answer-format instruction.
pub fn user_message(query: &str, format: AnswerFormat) -> String {
    let suffix = match format {
        AnswerFormat::Exact => FORMAT_EXACT,
        AnswerFormat::Short => FORMAT_SHORT,
        AnswerFormat::Long => FORMAT_LONG,
    };
    format!("{}\n\n{}", query.trim(), suffix.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "google_search".into(),
                description: "web search.".into(),
                attributes: "gl, hl".into(),
            },
            ToolSpec {
                name: "snippet_search".into(),
                description: "paper snippets.".into(),
                attributes: String::new(),
            },
        ]
    }

    #[test]
    fn rubricem_prompt_carries_the_grammar() {
        let p = system_prompt(Scaffold::Rubricem, &tools(), 10).unwrap();
        for tag in [
            "<think>",
            "<structured_plan>",
            "<deep_analysis>",
            "<rubric>",
            "<research_plan>",
            "<call_tool",
            "<state_evaluation>",
            "<review>",
            "<rubric_review>",
            "<writing_plan>",
            "<answer>",
            "<cite id=",
            "Knowledge checklist",
            "Analytical criteria",
            "Negative constraints",
            "at most 10 tool calls",
            "- google_search: web search. Attributes: gl, hl.",
            "- snippet_search: paper snippets.",
        ] {
            assert!(p.contains(tag), "missing {tag:?} in:\n{p}");
        }
        assert!(!p.contains("{{") && !p.contains("{%"));
    }

    #[test]
    fn baselines_render() {
        for s in [Scaffold::Drtulu, Scaffold::React] {
            let p = system_prompt(s, &tools(), 5).unwrap();
            assert!(
                p.contains("<call_tool") && p.contains("<answer>") && p.contains("5"),
                "{p}"
            );
            assert!(!p.contains("<structured_plan>"));
        }
    }

    #[test]
    fn format_suffixes_differ() {
        let e = user_message(" Q? ", AnswerFormat::Exact);
        assert!(e.starts_with("Q?\n\n") && e.contains("\\boxed{}"));
        assert_ne!(
            user_message("Q", AnswerFormat::Short),
            user_message("Q", AnswerFormat::Long)
        );
        assert_eq!(AnswerFormat::parse("long_form"), Some(AnswerFormat::Long));
        assert_eq!(AnswerFormat::parse("essay"), None);
    }
}
