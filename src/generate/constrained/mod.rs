//! Constrained decoding: a grammar the reply must follow (`matcher`: fixed texts and JSON values
//! of a schema's shapes, `schema`), and the grammar of `tool_choice` "required" or a named
//! function: calls to the request's tools in the model's own tool-call syntax (`tool_choice`).
//! The engine masks, at each step, the tokens whose text the grammar does not allow next.

pub mod matcher;
pub mod schema;
#[cfg(test)]
mod tests;
pub mod tool_choice;
