//! Constrained decoding: a [`Constraint`] (a compiled grammar, e.g. from a
//! JSON schema) says, step by step, which tokens a sequence may generate.
//! The engine starts one [`ConstraintState`] per sequence, masks the
//! logits with it before sampling and feeds it every token sampled.

/// A compiled grammar, shared by the sequences of a request.
pub trait Constraint: Send + Sync + std::fmt::Debug {
    /// A fresh matcher for one sequence, at the grammar's start.
    fn start(&self) -> Box<dyn ConstraintState>;

    /// The request field the grammar came from, named when the grammar
    /// engine gives up mid-generation.
    fn field(&self) -> &str {
        "response_format"
    }
}

/// A constraint with the request field it came from.
#[derive(Debug)]
pub struct FromField {
    pub constraint: std::sync::Arc<dyn Constraint>,
    pub field: String,
}

impl Constraint for FromField {
    fn start(&self) -> Box<dyn ConstraintState> {
        self.constraint.start()
    }

    fn field(&self) -> &str {
        &self.field
    }
}

/// One sequence's position in a grammar.
pub trait ConstraintState: Send {
    /// The tokens allowed next, as a bit set (bit `i % 32` of word `i / 32`
    /// set: token `i` allowed; words past the end: not allowed).
    fn allowed(&mut self) -> Result<Vec<u32>, String>;
    /// Advances past a sampled token.
    fn accept(&mut self, token: u32) -> Result<(), String>;
    /// Whether the grammar is complete and nothing may follow.
    fn is_finished(&self) -> bool;
}

/// Whether bit `token` is set in `mask`.
pub fn is_allowed(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32)
        .is_some_and(|w| w & (1 << (token % 32)) != 0)
}
