//! Chat templates rendered with minijinja configured like transformers' Jinja environment:
//! `trim_blocks`, `lstrip_blocks`, loop controls, Python string methods, and the `tojson`
//! filter, `raise_exception` and `strftime_now` that transformers adds.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not compile: {0}")]
    Compile(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    special: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

/// Python's `json.dumps(value, ensure_ascii=False)` formatting: `", "` and `": "` separators, or
/// with `indent` the pretty layout with `","` item separators.
pub fn python_json<T: Serialize + ?Sized>(
    value: &T,
    indent: Option<usize>,
) -> Result<String, String> {
    let mut out = Vec::new();
    match indent {
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PyCompact);
            value.serialize(&mut ser).map_err(|e| e.to_string())?;
        }
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            value.serialize(&mut ser).map_err(|e| e.to_string())?;
        }
    }
    String::from_utf8(out).map_err(|e| e.to_string())
}

struct PyCompact;

impl serde_json::ser::Formatter for PyCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    python_json(&value, indent)
        .map(Value::from)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e))
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    chrono::Local::now().format(&format).to_string()
}

impl ChatTemplate {
    /// Compile `source`; `special` are the variables (`eos_token`, …) passed to every render.
    pub fn new(source: &str, special: Vec<(String, String)>) -> Result<Self, TemplateError> {
        let mut env = crate::infra::prompts::chat_template_environment();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TemplateError::Compile(e.to_string()))?;
        Ok(Self { env, special })
    }

    /// Render a conversation. `messages` and `tools` are JSON in the OpenAI shape; `extra` holds
    /// further template variables (e.g. `enable_thinking`).
    pub fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        let mut ctx = serde_json::Map::new();
        for (k, v) in &self.special {
            ctx.insert(k.clone(), serde_json::Value::String(v.clone()));
        }
        ctx.insert("messages".into(), messages.clone());
        if let Some(t) = tools {
            ctx.insert("tools".into(), t.clone());
        }
        ctx.insert(
            "add_generation_prompt".into(),
            serde_json::Value::Bool(add_generation_prompt),
        );
        for (k, v) in extra {
            ctx.insert(k.clone(), v.clone());
        }
        tmpl.render(Value::from_serialize(&ctx))
            .map_err(|e| TemplateError::Render(crate::domain::util::error_chain(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_json_separators_and_unicode() {
        let v = serde_json::json!({"a": [1, 2, {"b": "é\n\"x\""}], "c": null, "d": true, "e": 1.5});
        assert_eq!(
            python_json(&v, None).unwrap(),
            r#"{"a": [1, 2, {"b": "é\n\"x\""}], "c": null, "d": true, "e": 1.5}"#
        );
        assert_eq!(
            python_json(&v["a"], Some(2)).unwrap(),
            "[\n  1,\n  2,\n  {\n    \"b\": \"é\\n\\\"x\\\"\"\n  }\n]"
        );
    }

    #[test]
    fn raise_exception_surfaces_message() {
        let t = ChatTemplate::new("{{ raise_exception('bad role') }}", vec![]).unwrap();
        let err = t
            .render(&serde_json::json!([]), None, false, &Default::default())
            .unwrap_err();
        assert!(err.to_string().contains("bad role"), "{err}");
    }

    #[test]
    fn compile_error_is_reported() {
        assert!(ChatTemplate::new("{% if %}", vec![]).is_err());
    }
}
