//! The `direction` guard's rules: the same things in reversed roles ("USD to EUR" / "EUR to USD",
//! "merge main into dev" / "merge dev into main", "Is Rust faster than Go" / "… Go faster than Rust")
//! and a relation turned into its converse ("cancel before it ships" / "… after it ships").
//!
//! Sentence embeddings average words, so a swap of two words moves a vector hardly at all (cosine
//! 0.95–0.999 on all-MiniLM-L6-v2). English marks who does what to whom by word order around a small,
//! closed class of relational words (prepositions of path and order, comparison's "than"); a content
//! word that moves from one side of such a word to the other has changed its role. Only that is
//! refused: content words that move without crossing one, as a fronted phrase does ("In Python, how
//! do I…"), keep their roles.
//!
//! Open-class relations mark roles by order too: in "Alice reports to Bob", "Is a square a subclass
//! of a rectangle?", "Does the app depend on the library?", "Does Carol owe Dan money?" the thing
//! before the relation and the thing after it play different parts, whatever the relation's words
//! are. So two texts that hold the same two things in opposite order around the very same words of
//! relation have swapped their roles ([`relation_swapped`]). Relations that hold both ways are not
//! swaps: coordination ("A and B", "A or B", "A vs B"), "between A and B", and predicates that are
//! symmetric by meaning ("compare", "similar", "different", "compatible", "equal", "married").
//! A change of voice moves the things and changes the words between them ("Bob manages Alice",
//! "Alice is managed by Bob"), so it is no swap either.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

/// Asymmetric relational words: the thing before plays another role than the thing after. Plain
/// coordination ("and", "or", "between", "vs") is symmetric and left out: "Python vs Java" asks
/// what "Java vs Python" asks.
const MARKERS: &[&str] = &[
    "to", "from", "into", "onto", "than", "before", "after", "over", "under", "above", "below",
    "toward", "towards", "by", "per",
];

/// Words whose relation holds both ways: "compare A to B" is "compare B to A", "A is similar to
/// B" is "B is similar to A". With one of them in or just before the relation, a swap changes
/// nothing.
const SYMMETRIC: &[&str] = &[
    "and",
    "or",
    "nor",
    "vs",
    "versus",
    "between",
    "compare",
    "compared",
    "comparing",
    "comparison",
    "contrast",
    "difference",
    "differences",
    "differ",
    "differs",
    "different",
    "similar",
    "similarity",
    "similarities",
    "same",
    "equal",
    "equals",
    "equivalent",
    "identical",
    "compatible",
    "compatibility",
    "like",
    "alike",
    "married",
    "related",
    "relationship",
    "match",
    "matches",
    "overlap",
    "together",
    "both",
    "either",
    "neither",
    "interchangeable",
];

/// The most words of relation between the two things ("is a subclass of", "reports directly to").
const MAX_RELATION_WORDS: usize = 5;

/// Relations and their converses, a closed class of prepositions and adverbs of order, place and
/// path (the open-class opposites such as "buy"/"sell" come from WordNet in the antonym guard).
const CONVERSES: &[(&str, &str)] = &[
    ("before", "after"),
    ("earlier", "later"),
    ("above", "below"),
    ("over", "under"),
    ("from", "to"),
    ("from", "into"),
    ("into", "out"),
    ("in", "out"),
    ("inside", "outside"),
    ("up", "down"),
    ("since", "until"),
    ("forward", "backward"),
    ("forwards", "backwards"),
    ("ascending", "descending"),
    ("inbound", "outbound"),
    ("incoming", "outgoing"),
    // Inside a period or place against past it: "cancel within 14 days" / "… after 14 days".
    ("within", "after"),
    ("within", "beyond"),
    ("within", "outside"),
];

/// Closed-class words (determiners, pronouns, auxiliaries, prepositions, conjunctions, question
/// words): they carry grammar, not the things a question is about, so their moves mean nothing here.
const FUNCTION_WORDS: &[&str] = &[
    "a", "an", "the", "this", "that", "these", "those", "my", "your", "his", "her", "its", "our",
    "their", "i", "me", "you", "he", "she", "it", "we", "they", "them", "us", "him", "is", "are",
    "was", "were", "be", "been", "being", "am", "do", "does", "did", "have", "has", "had", "can",
    "could", "will", "would", "shall", "should", "may", "might", "must", "of", "in", "on", "at",
    "for", "with", "about", "as", "and", "or", "but", "if", "so", "then", "what", "which", "who",
    "whom", "whose", "when", "where", "why", "how", "there", "here", "some", "any", "all", "each",
    "every", "please", "just", "also", "very", "really", "i'm", "it's", "what's", "how's",
    "there's", "can't", "don't", "i'd", "you're", "let's", "way",
];

/// [`FUNCTION_WORDS`] and [`MARKERS`] as a set: every word of both prompts is looked up.
static GRAMMAR: LazyLock<HashSet<&'static str>> =
    LazyLock::new(|| FUNCTION_WORDS.iter().chain(MARKERS).copied().collect());

/// A closed-class word: grammar rather than a thing a question is about.
pub(super) fn is_function_word(word: &str) -> bool {
    GRAMMAR.contains(word)
}

fn is_content(word: &str) -> bool {
    !GRAMMAR.contains(word) && word.chars().any(char::is_alphanumeric)
}

/// Whether `a` and `b` are a relation and its converse.
pub(super) fn converse(a: &str, b: &str) -> bool {
    CONVERSES
        .iter()
        .any(|&(x, y)| (a == x && b == y) || (a == y && b == x))
}

/// Whether two content words trade sides of the same relational word: one moves from before it to
/// after it, another from after it to before it. Markers are matched by their occurrence (the
/// second "to" in one text against the second "to" in the other); words that occur more than once
/// on a side have no single role and are not compared.
pub(super) fn roles_swapped(query: &[String], candidate: &[String]) -> bool {
    marker_crossed(query, candidate) || relation_swapped(query, candidate)
}

/// Two content words trade sides of one relational word of [`MARKERS`], in a clause with no
/// symmetric predicate.
fn marker_crossed(query: &[String], candidate: &[String]) -> bool {
    let (q_count, c_count) = (content_counts(query), content_counts(candidate));
    // Content words that stand once in each text: their positions are comparable.
    let position = |tokens: &[String], word: &str| tokens.iter().position(|t| t == word);
    let shared: Vec<&str> = q_count
        .iter()
        .filter(|(w, n)| **n == 1 && c_count.get(**w) == Some(&1))
        .map(|(w, _)| *w)
        .collect();
    if shared.len() < 2 {
        return false;
    }
    for &marker in MARKERS {
        let q_at: Vec<usize> = occurrences(query, marker);
        let c_at: Vec<usize> = occurrences(candidate, marker);
        if q_at.is_empty() || q_at.len() != c_at.len() {
            continue;
        }
        for (&qm, &cm) in q_at.iter().zip(&c_at) {
            let (mut forward, mut backward) = (false, false);
            for word in &shared {
                let (Some(qp), Some(cp)) = (position(query, word), position(candidate, word))
                else {
                    continue;
                };
                match (qp < qm, cp < cm) {
                    (true, false) => forward = true,
                    (false, true) => backward = true,
                    _ => {}
                }
            }
            if forward && backward && !symmetric_near(query, qm) && !symmetric_near(candidate, cm) {
                return true;
            }
        }
    }
    false
}

/// Whether a symmetric word stands among the few words before a relational word at `at` ("compare
/// A to B", "is A similar to B", "the difference from A to B").
fn symmetric_near<S: AsRef<str>>(tokens: &[S], at: usize) -> bool {
    tokens[at.saturating_sub(MAX_RELATION_WORDS)..at]
        .iter()
        .any(|w| SYMMETRIC.contains(&w.as_ref()))
}

/// A thing a relation is about: a run of content words standing together in both texts ("new
/// york", "alice"), by its word range in each.
struct Unit {
    query: std::ops::Range<usize>,
    candidate: std::ops::Range<usize>,
}

/// The same two things, in opposite order in the two texts, with the same words of relation
/// between them ("alice reports to bob" / "bob reports to alice"; "is a square a subclass of a
/// rectangle" / "is a rectangle a subclass of a square"). The relation must hold a content word or
/// a relational word of its own (two things side by side, "password reset" / "reset password", are
/// one compound read two ways), must not be symmetric, and the words of relation are compared by
/// their stems without articles, so "reports to" and "report to", "the parent of" and "a parent of"
/// are one relation.
pub(super) fn relation_swapped(query: &[String], candidate: &[String]) -> bool {
    // A thing is the same thing in the singular, plural or possessive: "a cat … for dogs" and "a
    // dog … for cats" hold cat and dog in reversed roles.
    fn bare(w: &str) -> &str {
        let w = w.strip_suffix("'s").unwrap_or(w);
        if is_content(w) {
            stem(w)
        } else {
            w
        }
    }
    let (q, c): (Vec<&str>, Vec<&str>) = (
        query.iter().map(|w| bare(w)).collect(),
        candidate.iter().map(|w| bare(w)).collect(),
    );
    let units = units(&q, &c);
    if units.len() < 2 {
        return false;
    }
    for (i, a) in units.iter().enumerate() {
        for b in &units[i + 1..] {
            // a before b in the query, b before a in the candidate (units are in query order).
            if b.candidate.end > a.candidate.start || b.query.start < a.query.end {
                continue;
            }
            let (q_between, c_between) = (
                &q[a.query.end..b.query.start],
                &c[b.candidate.end..a.candidate.start],
            );
            if q_between.len() > MAX_RELATION_WORDS || c_between.len() > MAX_RELATION_WORDS {
                continue;
            }
            let (q_rel, c_rel) = (relation(q_between), relation(c_between));
            if q_rel.is_empty() || q_rel != c_rel {
                continue;
            }
            let symmetric = |tokens: &[&str], start: usize, between: &[&str]| {
                between.iter().any(|w| SYMMETRIC.contains(w)) || symmetric_near(tokens, start)
            };
            if !symmetric(&q, a.query.start, q_between)
                && !symmetric(&c, b.candidate.start, c_between)
            {
                return true;
            }
        }
    }
    false
}

/// The words of a relation as compared: stems of its words, articles and auxiliaries left out
/// ("is the parent of" → parent of). Empty when nothing but grammar stands there.
fn relation<'a>(between: &[&'a str]) -> Vec<&'a str> {
    let words: Vec<&str> = between
        .iter()
        .copied()
        .filter(|w| {
            !matches!(
                *w,
                "a" | "an" | "the" | "is" | "are" | "was" | "were" | "be" | "does" | "do" | "did"
            )
        })
        .map(stem)
        .collect();
    let meaningful = words.iter().any(|w| is_content(w) || MARKERS.contains(w))
        || words
            .iter()
            .any(|w| matches!(*w, "of" | "on" | "with" | "for" | "in" | "at"));
    if meaningful {
        words
    } else {
        Vec::new()
    }
}

/// A word without its regular inflection: "reports" → report, "managed" → manag, "depends" →
/// depend. Both sides go through the same cut, so only equality matters.
fn stem(word: &str) -> &str {
    for suffix in ["ing", "ed", "es", "s"] {
        if let Some(stem) = word.strip_suffix(suffix) {
            if stem.len() >= 3 {
                return stem;
            }
        }
    }
    word
}

/// The things both texts are about: maximal runs of content words that stand once, in the same
/// order, in both ("new york" in "is new york bigger than los angeles"), in query order.
fn units(query: &[&str], candidate: &[&str]) -> Vec<Unit> {
    let (q_count, c_count) = (content_counts(query), content_counts(candidate));
    let once = |w: &str| q_count.get(w) == Some(&1) && c_count.get(w) == Some(&1);
    // Where each content word stands in the candidate (only words that stand once are looked up).
    let at: HashMap<&str, usize> = candidate
        .iter()
        .enumerate()
        .filter(|(_, w)| c_count.get(**w) == Some(&1))
        .map(|(i, w)| (*w, i))
        .collect();
    let mut units = Vec::new();
    let mut i = 0;
    while i < query.len() {
        let word = query[i];
        if !is_content(word) || !once(word) {
            i += 1;
            continue;
        }
        let Some(&j) = at.get(word) else {
            i += 1;
            continue;
        };
        let mut len = 1;
        while i + len < query.len()
            && j + len < candidate.len()
            && query[i + len] == candidate[j + len]
            && is_content(query[i + len])
            && once(query[i + len])
        {
            len += 1;
        }
        units.push(Unit {
            query: i..i + len,
            candidate: j..j + len,
        });
        i += len;
    }
    units
}

fn content_counts<S: AsRef<str>>(tokens: &[S]) -> HashMap<&str, usize> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for t in tokens.iter().map(AsRef::as_ref).filter(|t| is_content(t)) {
        *count.entry(t).or_default() += 1;
    }
    count
}

fn occurrences(tokens: &[String], word: &str) -> Vec<usize> {
    tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| *t == word)
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Vec<String> {
        super::super::text::words(text)
    }

    #[test]
    fn reversed_roles_around_a_relational_word_are_swaps() {
        for (a, b) in [
            ("Convert 100 USD to EUR", "Convert 100 EUR to USD"),
            (
                "How do I merge main into dev?",
                "How do I merge dev into main?",
            ),
            ("Is Rust faster than Go?", "Is Go faster than Rust?"),
            (
                "Flights from Paris to London",
                "Flights from London to Paris",
            ),
            (
                "Divide the budget by the headcount",
                "Divide the headcount by the budget",
            ),
            ("Does Alice report to Bob?", "Does Bob report to Alice?"),
        ] {
            assert!(roles_swapped(&tokens(a), &tokens(b)), "{a} / {b}");
        }
    }

    #[test]
    fn moved_phrases_and_rewordings_keep_their_roles() {
        for (a, b) in [
            (
                "How do I convert a string to an int in Python?",
                "In Python, how do I convert a string to an int?",
            ),
            (
                "How far is it from Paris to London?",
                "How far is it to London from Paris?",
            ),
            ("Convert USD to EUR", "Convert USD to EUR please"),
            ("What is the capital of France?", "France's capital city?"),
            ("Send the file to Bob", "Send Bob the file"),
        ] {
            assert!(!roles_swapped(&tokens(a), &tokens(b)), "{a} / {b}");
        }
    }

    #[test]
    fn converses_are_closed_class_pairs() {
        assert!(converse("before", "after"));
        assert!(converse("after", "before"));
        assert!(converse("in", "out"));
        assert!(!converse("before", "prior"));
        assert!(!converse("to", "to"));
    }
}
