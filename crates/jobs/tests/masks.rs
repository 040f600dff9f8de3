//! Loss masks on the real default model's tokenizer and chat template.

mod common;

use hearth_api::training_data::parse_training_line;
use hearth_jobs::train::data::tokenize_example;
use hearth_jobs::{load_chat_parts, BaseModel, ChatParts};

fn parts() -> ChatParts {
    load_chat_parts(&BaseModel::Gguf(common::smollm_gguf())).expect("the default model loads")
}

fn trained_text(p: &ChatParts, line: &str) -> (String, String) {
    let ex = parse_training_line(line).unwrap();
    let (t, stable) = tokenize_example(&p.tokenizer, &p.template, &p.eos_ids, &ex).unwrap();
    assert!(stable, "the template's prefixes tokenise stably");
    assert_eq!(t.tokens.len(), t.loss.len());
    let ids: Vec<u32> = t
        .tokens
        .iter()
        .zip(&t.loss)
        .filter(|(_, &m)| m)
        .map(|(&id, _)| id)
        .collect();
    let all = p.tokenizer.decode(&t.tokens, false).unwrap();
    (p.tokenizer.decode(&ids, false).unwrap(), all)
}

#[test]
fn chat_loss_covers_assistant_turns_and_their_end() {
    let p = parts();
    let (trained, all) = trained_text(
        &p,
        r#"{"messages":[{"role":"user","content":"What is the vault code?"},{"role":"assistant","content":"The vault code is 7319."}]}"#,
    );
    assert_eq!(trained, "The vault code is 7319.<|im_end|>");
    assert!(all.starts_with("<|im_start|>system\n"), "{all}");
    assert!(
        all.ends_with("<|im_start|>assistant\nThe vault code is 7319.<|im_end|>\n"),
        "{all}"
    );

    // Several turns: an assistant turn with weight 0 carries no loss.
    let (trained, _) = trained_text(
        &p,
        r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello there.","weight":0},{"role":"user","content":"Bye"},{"role":"assistant","content":"Goodbye!"}]}"#,
    );
    assert_eq!(trained, "Goodbye!<|im_end|>");
    let (trained, _) = trained_text(
        &p,
        r#"{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Bye"},{"role":"assistant","content":"Bye."}]}"#,
    );
    assert_eq!(trained, "Hello.<|im_end|>Bye.<|im_end|>");
}

#[test]
fn completion_loss_covers_completion_and_eos() {
    let p = parts();
    let ex = parse_training_line(r#"{"prompt":"The capital of France is","completion":" Paris."}"#)
        .unwrap();
    let (t, _) = tokenize_example(&p.tokenizer, &p.template, &p.eos_ids, &ex).unwrap();
    let prompt =
        hearth_engine::tokenizer::encode(&p.tokenizer, "The capital of France is", true).unwrap();
    assert_eq!(&t.tokens[..prompt.len()], prompt.as_slice());
    assert!(t.loss[..prompt.len()].iter().all(|&m| !m));
    assert!(t.loss[prompt.len()..].iter().all(|&m| m));
    assert_eq!(*t.tokens.last().unwrap(), p.eos_ids[0]);
    let done = p
        .tokenizer
        .decode(&t.tokens[prompt.len()..t.tokens.len() - 1], false)
        .unwrap();
    assert_eq!(done, " Paris.");
}
