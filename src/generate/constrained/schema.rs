//! A JSON schema (a tool's `parameters`) as the shapes constrained decoding writes: objects with
//! their `properties` in any order, each once (the `required` ones always, no others), arrays (`items`,
//! `minItems`, `maxItems`), strings (`minLength`, `maxLength`), numbers, integers, booleans, null,
//! `enum` and `const` (their values' JSON text), and `anyOf`/`oneOf`/a list of `type`s as a
//! choice. Keywords it does not read leave the value free (any JSON value); `$ref` is refused.

use std::sync::Arc;

use serde_json::Value;

/// Digits a number's integer part, fraction or exponent has at most (a random model can then
/// not write a number forever).
pub const MAX_DIGITS: usize = 16;

/// One shape of JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// Any JSON value.
    Any,
    /// An object with these properties, each once in any order (`required` ones always) and no others;
    /// `None`: any keys, any values.
    Object(Option<Vec<Property>>),
    Array {
        items: Arc<Node>,
        min: usize,
        max: Option<usize>,
    },
    String {
        min: usize,
        max: Option<usize>,
    },
    /// `integer`: no fraction, no exponent.
    Number {
        integer: bool,
    },
    /// One of these exact JSON texts (`enum`, `const`, `true`/`false`, `null`).
    Literal(Vec<String>),
    /// One of these shapes.
    Choice(Vec<Arc<Node>>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    /// The key as it is written, quotes included.
    pub key: String,
    pub value: Arc<Node>,
    pub required: bool,
}

impl Node {
    /// The shape of `schema`; an error names what cannot be followed.
    pub fn of(schema: &Value) -> Result<Node, String> {
        let Value::Object(map) = schema else {
            return match schema {
                Value::Bool(true) => Ok(Node::Any),
                _ => Err(format!("a schema must be an object, got {schema}")),
            };
        };
        if map.contains_key("$ref") {
            return Err("schemas with \"$ref\" are not supported".into());
        }
        if let Some(value) = map.get("const") {
            return Ok(Node::Literal(vec![value.to_string()]));
        }
        if let Some(values) = map.get("enum") {
            let values = values.as_array().ok_or("\"enum\" must be a list")?;
            if values.is_empty() {
                return Err("\"enum\" must not be empty".into());
            }
            return Ok(Node::Literal(values.iter().map(Value::to_string).collect()));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = map.get(key) {
                let options = options.as_array().filter(|o| !o.is_empty());
                let options = options.ok_or_else(|| format!("\"{key}\" must be a non-empty list"))?;
                return Ok(Node::Choice(
                    options.iter().map(|o| Node::of(o).map(Arc::new)).collect::<Result<_, _>>()?,
                ));
            }
        }
        match map.get("type") {
            None => Ok(Node::Any),
            Some(Value::String(kind)) => typed(kind, map),
            Some(Value::Array(kinds)) => {
                let kinds = kinds.iter().map(|k| k.as_str().ok_or("\"type\" must hold strings"));
                Ok(Node::Choice(kinds.map(|k| typed(k?, map).map(Arc::new)).collect::<Result<_, String>>()?))
            }
            Some(other) => Err(format!("\"type\" must be a string or a list, got {other}")),
        }
    }
}

fn typed(kind: &str, map: &serde_json::Map<String, Value>) -> Result<Node, String> {
    let count = |key: &str| map.get(key).and_then(Value::as_u64).map(|n| n as usize);
    Ok(match kind {
        "object" => match map.get("properties").and_then(Value::as_object) {
            None => Node::Object(None),
            Some(properties) => {
                let required: Vec<&str> = map
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                if let Some(missing) = required.iter().find(|r| !properties.contains_key(**r)) {
                    return Err(format!("required property {missing:?} is not in \"properties\""));
                }
                let properties = properties.iter().map(|(name, schema)| {
                    let value = Node::of(schema).map_err(|e| format!("property {name:?}: {e}"))?;
                    let key = Value::String(name.clone()).to_string();
                    Ok(Property { key, value: Arc::new(value), required: required.contains(&name.as_str()) })
                });
                Node::Object(Some(properties.collect::<Result<_, String>>()?))
            }
        },
        "array" => {
            let items = match map.get("items") {
                Some(items) => Node::of(items).map_err(|e| format!("items: {e}"))?,
                None => Node::Any,
            };
            let (min, max) = (count("minItems").unwrap_or(0), count("maxItems"));
            if max.is_some_and(|max| max < min) {
                return Err("\"maxItems\" is below \"minItems\"".into());
            }
            Node::Array { items: Arc::new(items), min, max }
        }
        "string" => {
            let (min, max) = (count("minLength").unwrap_or(0), count("maxLength"));
            if max.is_some_and(|max| max < min) {
                return Err("\"maxLength\" is below \"minLength\"".into());
            }
            Node::String { min, max }
        }
        "number" => Node::Number { integer: false },
        "integer" => Node::Number { integer: true },
        "boolean" => Node::Literal(vec!["true".into(), "false".into()]),
        "null" => Node::Literal(vec!["null".into()]),
        other => return Err(format!("unknown \"type\" {other:?}")),
    })
}
