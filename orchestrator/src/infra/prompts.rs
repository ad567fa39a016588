//! The prompts door: prompts are data under `prompts/`, embedded at build time and rendered
//! with minijinja. This is the only module that builds a minijinja `Environment` (clippy's
//! `disallowed-methods` enforces it): [`environment`] is the strict one every prompt renders
//! with (a misspelt variable is an error, never empty text), [`chat_template_environment`] the
//! bare one `chat::template` configures like transformers' Jinja. It selects and renders; it
//! holds no prompt prose.

use minijinja::Environment;

use crate::domain::bank::{BankError, Retrieved};
use crate::infra::chat::TemplateError;

pub use crate::domain::scaffold::{AnswerFormat, Scaffold, ToolSpec};

const RUBRICEM: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/agent/rubricem.jinja"
));
const DRTULU: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/agent/drtulu.jinja"
));
const REACT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/agent/react.jinja"
));
const FORMAT_EXACT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/agent/format_exact.txt"
));
const FORMAT_SHORT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/agent/format_short.txt"
));
const FORMAT_LONG: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/agent/format_long.txt"
));

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
    let env = environment();
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

/// The environment every prompt renders with: strict undefined (a missing or misspelt variable
/// is an error), `trim_blocks` and `lstrip_blocks`.
#[allow(clippy::disallowed_methods)] // the door itself
pub fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env
}

/// A bare environment for a model's own chat template, which `chat::template` configures like
/// transformers' Jinja (lenient undefined, Python string methods).
#[allow(clippy::disallowed_methods)] // the door itself
pub fn chat_template_environment() -> Environment<'static> {
    Environment::new()
}

/// Render `source` (one of the embedded prompts) with [`environment`].
pub fn render(source: &str, ctx: minijinja::Value) -> Result<String, minijinja::Error> {
    environment().render_str(source, ctx)
}

const JUDGE_RUBRIC: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/judge/rubric.jinja"
));

/// The per-rubric judge prompt (DR Tulu's granularity, method.md B.2): the question, the judged
/// text (the final answer) and one criterion; the judge answers `{"score": 0|1|2}`.
/// The per-rubric judge prompt on DeepRubric's 0-4 scale (`prompts/judge/rubric_4.jinja`).
pub fn judge_rubric_prompt_4(
    question: &str,
    response: &str,
    criterion: &str,
) -> Result<String, minijinja::Error> {
    render(
        JUDGE_RUBRIC_4,
        minijinja::context! {
            question => question.trim(),
            response => response.trim(),
            criterion => criterion.trim(),
        },
    )
    .map(|s| s.trim().to_string())
}

const JUDGE_RUBRIC_4: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/judge/rubric_4.jinja"
));

pub fn judge_rubric_prompt(
    question: &str,
    response: &str,
    criterion: &str,
) -> Result<String, minijinja::Error> {
    render(
        JUDGE_RUBRIC,
        minijinja::context! {
            question => question.trim(),
            response => response.trim(),
            criterion => criterion.trim(),
        },
    )
    .map(|s| s.trim().to_string())
}

const REFLECTION_SYSTEM: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/reflection/system.txt"
));
const REFLECTION_USER: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/reflection/user.jinja"
));

/// The reflection meta-policy's system and user messages for one trajectory.
pub fn reflection_prompt(
    question: &str,
    trajectory: &str,
) -> Result<(String, String), minijinja::Error> {
    let user = render(
        REFLECTION_USER,
        minijinja::context! { question => question.trim(), trajectory => trajectory },
    )?;
    Ok((
        REFLECTION_SYSTEM.trim().to_string(),
        user.trim().to_string(),
    ))
}

const BANK_WITHIN: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/reflection/within.jinja"
));
const BANK_CROSS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/reflection/cross.jinja"
));

/// Rendering retrieved bank items (method.md A.6.5) lives with the other prompts.
impl Retrieved {
    /// The `<reference_examples>` block, or "" for nothing.
    pub fn render(&self) -> Result<String, BankError> {
        let (name, src, ctx) = match self {
            Retrieved::Nothing => return Ok(String::new()),
            Retrieved::Cross(v) if v.is_empty() => return Ok(String::new()),
            Retrieved::Within(it) => (
                "within",
                BANK_WITHIN,
                minijinja::context! { rubrics => it.rubrics.trim(), takeaways => it.takeaways.trim() },
            ),
            Retrieved::Cross(v) => {
                let items: Vec<_> = v
                    .iter()
                    .map(|(it, _)| {
                        minijinja::context! {
                            question => it.question.trim(),
                            rubrics => it.rubrics.trim(),
                            takeaways => it.takeaways.trim(),
                        }
                    })
                    .collect();
                ("cross", BANK_CROSS, minijinja::context! { items => items })
            }
        };
        render(src, ctx)
            .map(|s| s.trim().to_string())
            .map_err(|e| BankError::Prompt {
                name,
                message: e.to_string(),
            })
    }

    /// The user message with the block and a blank line prepended (unchanged when nothing was
    /// retrieved).
    pub fn inject(&self, user: &str) -> Result<String, BankError> {
        let block = self.render()?;
        Ok(if block.is_empty() {
            user.to_string()
        } else {
            format!("{block}\n\n{user}")
        })
    }
}

/// The benchmark graders' templates (`prompts/eval/`), by name.
/// DeepRubric's templates (`prompts/deeprubric/`): the root page's summary and information
/// points, statement extraction, stop gate, sub-query proposal, co-generation and verification.
pub const DEEPRUBRIC_TEMPLATES: [(&str, &str); 6] = [
    (
        "root",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/deeprubric/root.jinja"
        )),
    ),
    (
        "statements",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/deeprubric/statements.jinja"
        )),
    ),
    (
        "gate",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/deeprubric/gate.jinja"
        )),
    ),
    (
        "subqueries",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/deeprubric/subqueries.jinja"
        )),
    ),
    (
        "compose",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/deeprubric/compose.jinja"
        )),
    ),
    (
        "verify",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/deeprubric/verify.jinja"
        )),
    ),
];

pub const EVAL_TEMPLATES: [(&str, &str); 14] = [
    (
        "criterion",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/criterion.jinja"
        )),
    ),
    (
        "verdict",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/verdict.jinja"
        )),
    ),
    (
        "coverage",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/coverage.jinja"
        )),
    ),
    (
        "race",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/race.jinja"
        )),
    ),
    (
        "clean",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/clean.jinja"
        )),
    ),
    (
        "three_class",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/three_class.jinja"
        )),
    ),
    (
        "equivalence",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/equivalence.jinja"
        )),
    ),
    (
        "ingredients",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/ingredients.jinja"
        )),
    ),
    (
        "precision",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/precision.jinja"
        )),
    ),
    (
        "citations",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/citations.jinja"
        )),
    ),
    (
        "facts",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/facts.jinja"
        )),
    ),
    (
        "fact_support",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/fact_support.jinja"
        )),
    ),
    (
        "dedupe",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/dedupe.jinja"
        )),
    ),
    (
        "cot_qa",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompts/eval/cot_qa.jinja"
        )),
    ),
];

/// The embedded grader template `name`.
pub fn eval_template(name: &str) -> Option<&'static str> {
    EVAL_TEMPLATES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, source)| *source)
}

/// Check that `source` compiles as a template (a user's `--grader-template` file).
pub fn check_template(source: &str) -> Result<(), minijinja::Error> {
    environment().template_from_str(source).map(|_| ())
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
    fn judge_rubric_prompt_shows_one_criterion_and_the_json_shape() {
        let p = judge_rubric_prompt(" Q? ", "The answer.", "Names the enzyme").unwrap();
        assert!(p.contains("<question>\nQ?\n</question>"), "{p}");
        assert!(p.contains("<response>\nThe answer.\n</response>"), "{p}");
        assert!(
            p.contains("<criterion>\nNames the enzyme\n</criterion>"),
            "{p}"
        );
        assert!(p.contains(r#"{"score": 2}"#), "{p}");
        assert!(!p.contains("{{") && !p.contains("{%"));
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
