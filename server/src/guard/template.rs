//! The `template` guard's rule: two prompts made from one template, a long frame of identical words
//! with one slot filled differently ("Write a cover letter for a junior developer job at acme" /
//! "… at globex", "Is `retry_limit` read from the config file at start-up?" / "… `retry_delay` …").
//!
//! Templated prompts are how programs and people ask many questions of one kind; what they ask
//! about is in the slot. A sentence embedding, which averages the words, sees a long shared frame
//! and scores such pairs 0.9 and more, though each asks about another thing. The slot is what tells
//! them apart, so the rule reads the alignment of the two prompts: exactly one place differs, the
//! words around it (the frame) are many, and the slot holds on both sides a name, identifier, number
//! or quotation, or a passage of several words with no content word in common.
//!
//! A paraphrase rewords: it changes several places of the frame, or one word for a word of another
//! kind ("Could you" for "Can you", "make" for "cook"); a slot of common words is left to the other
//! guards, since one common word for another is how people paraphrase. A slip of the fingers in a
//! name ("acme" / "amce") is the same name.

use std::ops::Range;

use super::text::is_slip_of;
use super::{entity, Literals};

/// One place where two aligned prompts differ: the query's words there and the candidate's.
pub(super) type Change = (Range<usize>, Range<usize>);

/// The fewest identical words around the slot for the two prompts to read as one template: a
/// question of its own, not two short questions that share a few words.
const MIN_FRAME: usize = 6;

/// The most words of a slot read as a name ("new york city").
const MAX_NAME_WORDS: usize = 3;

/// The fewest words of a slot read as a passage (a quoted sentence, a pasted value): more than a
/// few words, so that a reworded phrase ("as soon as possible" / "quickly") is not one.
const MIN_PASSAGE_WORDS: usize = 4;

/// Whether `query` and `candidate` are one template with its one slot filled by other names or
/// passages.
pub(super) fn other_slot(
    query: &Literals,
    candidate: &Literals,
    changes: &[Change],
    shared: usize,
) -> bool {
    let Some((q, c)) = one_slot(&query.words, changes) else {
        return false;
    };
    if shared < MIN_FRAME || q.is_empty() || c.is_empty() {
        return false;
    }
    let (q_slot, c_slot) = (&query.words[q.clone()], &candidate.words[c.clone()]);
    let names = q_slot.len() <= MAX_NAME_WORDS
        && c_slot.len() <= MAX_NAME_WORDS
        && q_slot.iter().any(|w| name_like(w, query))
        && c_slot.iter().any(|w| name_like(w, candidate))
        && !slips(q_slot, c_slot);
    let passages = q_slot.len() >= MIN_PASSAGE_WORDS
        && c_slot.len() >= MIN_PASSAGE_WORDS
        && !q_slot
            .iter()
            .any(|w| !super::direction::is_function_word(w) && c_slot.contains(w));
    names || passages
}

/// The one place where the two differ, if there is one: a single change, or two that only one
/// function word keeps apart (two passages that happen to share a "the" are still one slot). Three
/// changes or more are a rewording: a paraphrase swaps words one by one and keeps the grammar
/// between them ("Can you write a short…" / "Could you draft a brief…").
fn one_slot(query: &[String], changes: &[Change]) -> Option<Change> {
    match changes {
        [one] => Some(one.clone()),
        [(q1, c1), (q2, c2)] => {
            let gap = &query[q1.end..q2.start.max(q1.end)];
            (gap.len() == 1 && super::direction::is_function_word(&gap[0]))
                .then_some((q1.start..q2.end, c1.start..c2.end))
        }
        _ => None,
    }
}

/// A word that names a thing rather than describes it: it holds a digit ("v2", "gpt4"), WordNet
/// knows it only as a proper noun, or it is part of a name, quotation or identifier the entity
/// reading found in the same prompt.
fn name_like(word: &str, literals: &Literals) -> bool {
    word.chars().any(|c| c.is_ascii_digit())
        || entity::is_proper(word)
        || literals.names.iter().any(|name| {
            name.split(|c: char| !c.is_alphanumeric())
                .any(|part| part == word)
        })
}

/// Whether the two slots are one name typed two ways: the same words but one, and that one a slip
/// of the other (a letter left out or two swapped).
fn slips(query: &[String], candidate: &[String]) -> bool {
    query.len() == candidate.len()
        && query.iter().zip(candidate).all(|(q, c)| {
            q == c || (q.len().min(c.len()) >= 4 && (is_slip_of(q, c) || is_slip_of(c, q)))
        })
}

#[cfg(test)]
mod tests {
    use super::super::Guards;

    fn template(a: &str, b: &str) -> bool {
        let guards: Guards = "template".parse().expect("valid");
        guards.refuses_texts(a, b).is_some()
    }

    #[test]
    fn one_slot_of_a_long_frame_filled_with_another_name_is_refused() {
        for (a, b) in [
            (
                "Write a short cover letter for a junior developer job at Acme",
                "Write a short cover letter for a junior developer job at Globex",
            ),
            (
                "What is the default value of retry_limit in the worker config file?",
                "What is the default value of retry_delay in the worker config file?",
            ),
            (
                "Plan a three day walking itinerary for nebraska in the spring",
                "Plan a three day walking itinerary for vermont in the spring",
            ),
            (
                "Explain what the error code E1042 means in the build log",
                "Explain what the error code E2213 means in the build log",
            ),
            (
                "Reply to the customer who wrote \"the parcel arrived broken and late\" with an apology",
                "Reply to the customer who wrote \"my invoice shows the wrong address\" with an apology",
            ),
        ] {
            assert!(template(a, b), "{a} / {b}");
            assert!(template(b, a), "{b} / {a}");
        }
    }

    #[test]
    fn reworded_frames_common_words_and_slips_pass() {
        for (a, b) in [
            // One common word for another: how people paraphrase.
            (
                "How do I cook brown rice in a pressure cooker?",
                "How do I make brown rice in a pressure cooker?",
            ),
            // Several places of the frame reworded.
            (
                "Can you write a short cover letter for a developer job at acme",
                "Could you draft a brief cover letter for a developer job at acme",
            ),
            // A slip of the fingers in the name.
            (
                "Write a short cover letter for a junior developer job at globex",
                "Write a short cover letter for a junior developer job at glboex",
            ),
            // A short frame: two questions that share a few words.
            ("Weather in acme today?", "Weather in globex today?"),
            // A phrase reworded in place, a few words long.
            (
                "Please send the quarterly report to the whole team as soon as possible",
                "Please send the quarterly report to the whole team right away",
            ),
            // A name on one side only.
            (
                "What are the opening hours of the museum on public holidays?",
                "What are the opening hours of the Louvre on public holidays?",
            ),
        ] {
            assert!(!template(a, b), "{a} / {b}");
            assert!(!template(b, a), "{b} / {a}");
        }
    }
}
