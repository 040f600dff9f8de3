//! Resource ids: a prefix and a ULID (`project-01J...`, `file-01J...`,
//! `ftjob-01J...`), so ids sort by creation time.

use std::sync::Mutex;

use ulid::{Generator, Ulid};

pub const PROJECT: &str = "project";
pub const ACCOUNT: &str = "account";
pub const KEY: &str = "key";
pub const FILE: &str = "file";
pub const FT_JOB: &str = "ftjob";
pub const FT_EVENT: &str = "ftevent";
pub const FT_CHECKPOINT: &str = "ftckpt";
pub const BATCH: &str = "batch";
pub const DATASET: &str = "dataset";
pub const DATASET_UPLOAD: &str = "dsupload";
pub const DATASET_PART: &str = "dspart";
pub const SERVICE_ACCOUNT: &str = "serviceaccount";
pub const AUTHORIZED_KEY: &str = "publickey";
pub const GROUP: &str = "group";
pub const ADAPTER: &str = "adapter";

/// A new id with `prefix`; ids made by one process are strictly increasing.
pub fn new_id(prefix: &str) -> String {
    static GENERATOR: Mutex<Option<Generator>> = Mutex::new(None);
    let mut guard = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    let generator = guard.get_or_insert_with(Generator::new);
    let ulid = generator.generate().unwrap_or_else(|_| Ulid::new());
    format!("{prefix}-{ulid}")
}

/// Whether `id` is `prefix-` followed by a well-formed ULID.
pub fn is_well_formed(prefix: &str, id: &str) -> bool {
    id.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|ulid| ulid.len() == 26 && Ulid::from_string(ulid).is_ok())
}

/// 32 random hex digits, for ids made outside the store (OpenAI-shaped
/// `chatcmpl-...`, `resp_...`, `batch_req_...`).
pub fn random_hex() -> String {
    use rand::Rng;
    let n: u128 = rand::rng().random();
    format!("{n:032x}")
}

/// The longest name a project, key or quota model may have, in characters.
pub const MAX_NAME_CHARS: usize = 256;

/// Whether `value` may be the `field` of a project, a key or a quota: not
/// empty or only whitespace, at most [`MAX_NAME_CHARS`] characters; else
/// the message saying why (naming `field`).
pub fn check_name(field: &str, value: &str) -> Result<(), String> {
    // Blank: nothing but white space, controls and the zero-width or
    // invisible format characters (U+200B..U+200F, U+2060..U+2064, BOM).
    let invisible = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(c, '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}')
    };
    if value.chars().all(invisible) {
        return Err(format!("`{field}` must not be empty."));
    }
    let chars = value.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(format!(
            "`{field}` must be at most {MAX_NAME_CHARS} characters, got {chars}."
        ));
    }
    Ok(())
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_and_invisible_names_are_refused() {
        for name in ["", " \t\n", "\u{a0}", "\u{200b}", "\u{feff}\u{2060}"] {
            assert!(check_name("name", name).is_err(), "{name:?}");
        }
        assert!(check_name("name", " a\u{200b}").is_ok());
        assert!(check_name("name", &"x".repeat(MAX_NAME_CHARS + 1)).is_err());
    }

    #[test]
    fn ids_are_prefixed_increasing_and_checked() {
        let a = new_id(FILE);
        let b = new_id(FILE);
        assert!(a < b, "{a} {b}");
        assert!(is_well_formed(FILE, &a));
        assert!(!is_well_formed(PROJECT, &a));
        assert!(!is_well_formed(FILE, "file-123"));
        assert!(!is_well_formed(FILE, "file"));
    }
}
