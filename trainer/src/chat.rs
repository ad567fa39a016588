//! The model directory's chat template (tokenizer_config.json `chat_template`), rendered with
//! minijinja and Python-compatible string methods: one place for serving and SFT.

use serde_json::{Value, json};

/// Render `messages` (role, content) through the template.
// The trainer's one minijinja environment: this is its door (clippy.toml).
#[allow(clippy::disallowed_methods)]
pub fn render(
    template: &str,
    messages: &[(&str, &str)],
    add_generation_prompt: bool,
) -> Result<String, minijinja::Error> {
    let mut env = minijinja::Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    let msgs: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    env.template_from_str(template)?
        .render(minijinja::context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
        })
}
