//! The `task` and `format` guards' reading: what a prompt asks the model to do (summarize, translate,
//! explain…) and in what shape (JSON, a table, French, one sentence, formally). "Summarize this
//! contract" and "Translate this contract" share every word that matters to an embedding but one.
//!
//! Both are read from closed vocabularies of instructions, not from examples: a request states its
//! task with an imperative verb at the head of a sentence ("Summarize…", "Can you translate…"), and
//! its output with a small set of standard phrasings ("as JSON", "in a table", "in French", "in one
//! sentence", "step by step"). Verbs elsewhere ("a linked list", "the summary page") are not tasks.

use std::collections::BTreeSet;

/// Tasks by kind; each verb is the imperative an instruction starts with. Near-synonyms share a kind
/// ("explain" and "describe" ask for the same exposition), so a reworded instruction still matches.
const TASKS: &[(&str, &[&str])] = &[
    (
        "summarize",
        &["summarize", "summarise", "condense", "tldr", "recap"],
    ),
    ("translate", &["translate"]),
    (
        "explain",
        &["explain", "describe", "elaborate", "clarify", "interpret"],
    ),
    ("list", &["list", "enumerate"]),
    ("compare", &["compare", "contrast"]),
    (
        "rewrite",
        &[
            "rewrite",
            "rephrase",
            "paraphrase",
            "reword",
            "proofread",
            "edit",
            "polish",
            "improve",
        ],
    ),
    ("fix", &["fix", "debug", "correct", "repair"]),
    (
        "write",
        &["write", "draft", "compose", "generate", "create"],
    ),
    (
        "classify",
        &["classify", "categorize", "categorise", "label", "tag"],
    ),
    ("extract", &["extract"]),
    (
        "review",
        &["review", "critique", "evaluate", "assess", "grade"],
    ),
    ("refactor", &["refactor", "optimize", "optimise"]),
    ("calculate", &["calculate", "compute", "solve"]),
    ("define", &["define"]),
    ("convert", &["convert", "transform"]),
    ("analyze", &["analyze", "analyse"]),
    ("outline", &["outline"]),
];

/// Tasks named by their noun after a verb that only says "produce it" ("give me a summary of",
/// "write a translation", "I need an explanation"): the noun is the task, as its verb would be.
const TASK_NOUNS: &[(&str, &str)] = &[
    ("summary", "summarize"),
    ("synopsis", "summarize"),
    ("recap", "summarize"),
    ("tldr", "summarize"),
    ("translation", "translate"),
    ("explanation", "explain"),
    ("description", "explain"),
    ("comparison", "compare"),
    ("definition", "define"),
    ("analysis", "analyze"),
    ("outline", "outline"),
    ("review", "review"),
    ("critique", "review"),
    ("evaluation", "review"),
    ("assessment", "review"),
    ("classification", "classify"),
    ("rewrite", "rewrite"),
    ("paraphrase", "rewrite"),
];

/// Verbs that only say "produce" or "give": before a task noun they carry no task of their own.
const PRODUCE_VERBS: &[&str] = &[
    "give", "provide", "write", "make", "produce", "prepare", "do", "create", "generate", "offer",
    "get", "need", "want", "draft", "compose",
];

/// Verbs that open another part of a request after "and": "… and give an example", "… and list
/// the risks". A request with one more part than another asks for more than the other's answer.
const PART_VERBS: &[&str] = &[
    "give",
    "list",
    "explain",
    "show",
    "include",
    "provide",
    "add",
    "tell",
    "describe",
    "write",
    "suggest",
    "recommend",
    "mention",
    "name",
    "compare",
    "summarize",
    "summarise",
    "translate",
    "cite",
    "outline",
    "define",
    "note",
    "offer",
    "share",
    "estimate",
    "predict",
];

/// Question words that open another question after "and": "What is it and how does it work?"
/// asks for a mechanism or a reason besides a definition. "and what" or "and who" mostly restates
/// the question ("who do I call and what do I do?"), so those are not counted.
const QUESTION_WORDS: &[&str] = &["how", "why"];

/// Words that may stand before the task verb of a request: "Can you please summarize…", "Now
/// translate…", "I want you to list…", "Help me draft…".
const LEAD_IN: &[&str] = &[
    "please", "pls", "kindly", "now", "also", "then", "can", "could", "would", "will", "you", "u",
    "help", "me", "to", "want", "need", "i", "just", "quickly",
];

/// Output formats named as such, and what they are read as.
const FORMATS: &[(&str, &str)] = &[
    ("json", "json"),
    ("csv", "csv"),
    ("tsv", "tsv"),
    ("yaml", "yaml"),
    ("yml", "yaml"),
    ("xml", "xml"),
    ("html", "html"),
    ("markdown", "markdown"),
    ("latex", "latex"),
    ("bullet", "bullets"),
    ("bullets", "bullets"),
    ("bulleted", "bullets"),
    ("haiku", "poem"),
    ("poem", "poem"),
    ("limerick", "poem"),
    ("tweet", "tweet"),
    ("emoji", "emoji"),
    ("emojis", "emoji"),
];

/// Length and register, stated by an adverb of the instruction ("explain briefly"): these modify
/// how to answer wherever they stand.
const REGISTER_ADVERBS: &[(&str, &str)] = &[
    ("briefly", "brief"),
    ("concisely", "brief"),
    ("succinctly", "brief"),
    ("tldr", "brief"),
    ("eli5", "simple"),
    ("thoroughly", "detailed"),
    ("formally", "formal"),
    ("informally", "casual"),
    ("casually", "casual"),
];

/// Length and register stated by an adjective: only of the answer itself ("a concise explanation",
/// "keep it brief"). Elsewhere the same adjective is part of the topic: "a formal complaint", "a
/// detailed map", "a brief history of time".
const REGISTER_ADJECTIVES: &[(&str, &str)] = &[
    ("brief", "brief"),
    ("short", "brief"),
    ("concise", "brief"),
    ("succinct", "brief"),
    ("detailed", "detailed"),
    ("thorough", "detailed"),
    ("comprehensive", "detailed"),
    ("long", "detailed"),
    ("formal", "formal"),
    ("professional", "formal"),
    ("informal", "casual"),
    ("casual", "casual"),
    ("friendly", "casual"),
    ("simple", "simple"),
    ("funny", "humorous"),
    ("humorous", "humorous"),
    ("sarcastic", "humorous"),
];

/// What an answer is called in a request, so an adjective before it describes the answer.
const ANSWER_NOUNS: &[&str] = &[
    "answer",
    "answers",
    "explanation",
    "summary",
    "response",
    "reply",
    "overview",
    "description",
    "version",
    "tone",
    "style",
    "manner",
    "way",
    "terms",
    "words",
    "email",
    "letter",
    "message",
    "note",
    "paragraph",
    "essay",
    "list",
];

/// Natural and programming languages an answer can be asked "in" or "into". English, the default
/// of an unmarked request, is left out: "… in English" asks what the plain request gets anyway.
const LANGUAGES: &[&str] = &[
    "french",
    "spanish",
    "german",
    "italian",
    "portuguese",
    "dutch",
    "russian",
    "chinese",
    "mandarin",
    "cantonese",
    "japanese",
    "korean",
    "arabic",
    "hindi",
    "bengali",
    "urdu",
    "turkish",
    "polish",
    "swedish",
    "norwegian",
    "danish",
    "finnish",
    "greek",
    "hebrew",
    "latin",
    "welsh",
    "irish",
    "ukrainian",
    "czech",
    "romanian",
    "hungarian",
    "vietnamese",
    "thai",
    "indonesian",
    "malay",
    "swahili",
    "persian",
    "farsi",
    "catalan",
    "python",
    "javascript",
    "typescript",
    "java",
    "rust",
    "go",
    "golang",
    "c",
    "c++",
    "c#",
    "ruby",
    "php",
    "kotlin",
    "swift",
    "scala",
    "haskell",
    "sql",
    "bash",
    "powershell",
    "r",
    "matlab",
    "perl",
    "lua",
    "elixir",
    "dart",
];

/// What a prompt asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Asks {
    /// Kinds of task its instructions start with.
    pub tasks: BTreeSet<&'static str>,
    /// Output shape, language, length and register.
    pub formats: BTreeSet<String>,
    /// Parts added to the request by an additive connective: "and also …", "as well as …", "…
    /// and give an example", "… and how does it work?". Each asks for something the other side's
    /// answer may not hold.
    pub parts: usize,
}

impl Asks {
    pub(super) fn of(text: &str) -> Self {
        let mut asks = Asks::default();
        // Each sentence (or line) can open with its own instruction: "Here is my essay. Proofread it."
        for sentence in text.split(['.', '?', '!', ';', ':', '\n']) {
            asks.read(&super::text::words(sentence));
        }
        asks
    }

    fn read(&mut self, words: &[String]) {
        let asks = self;
        let mut head = true;
        for (i, word) in words.iter().enumerate() {
            let w = word.as_str();
            let prev = i.checked_sub(1).map(|p| words[p].as_str());
            let next = words.get(i + 1).map(String::as_str);
            if head {
                let produce = PRODUCE_VERBS.contains(&w);
                // "Write a summary of it" asks to summarize it; "write a poem" to write.
                let noun = produce.then(|| task_noun(&words[i + 1..])).flatten();
                if let Some(kind) = noun {
                    asks.tasks.insert(kind);
                } else if let Some((kind, _)) = TASKS.iter().find(|(_, verbs)| verbs.contains(&w)) {
                    asks.tasks.insert(kind);
                }
            }
            asks.parts += usize::from(opens_part(prev, w, next));
            // The head of the request lasts through its lead-in words: "could you please
            // summarize" has its verb fourth.
            head = head && LEAD_IN.contains(&w) || is_conjunction(w);
            if let Some((_, format)) = FORMATS.iter().find(|(name, _)| *name == w) {
                asks.formats.insert((*format).to_owned());
            }
            // An adverb of register says how to answer unless it modifies another verb: "explain
            // it briefly" and "briefly explain" are about the answer, "how do I formally raise a
            // complaint" is about the complaint.
            if let Some((_, register)) = REGISTER_ADVERBS.iter().find(|(name, _)| *name == w) {
                if next.is_none_or(of_the_answer) {
                    asks.formats.insert((*register).to_owned());
                }
            }
            let of_answer = next.is_some_and(|n| ANSWER_NOUNS.contains(&n))
                || matches!(
                    prev,
                    Some("be" | "it" | "more" | "very" | "extra" | "super")
                );
            if let Some((_, register)) = REGISTER_ADJECTIVES.iter().find(|(name, _)| *name == w) {
                if of_answer {
                    asks.formats.insert((*register).to_owned());
                }
            }
            let before_prev = i.checked_sub(2).map(|p| words[p].as_str());
            match (prev, w, next) {
                // "as a table", "in a table", "in table form"; not "a hash table", "a table for two"
                (Some("as" | "in" | "into"), "table", _) => {
                    asks.formats.insert("table".into());
                }
                (Some("a"), "table", _) if matches!(before_prev, Some("as" | "in" | "into")) => {
                    asks.formats.insert("table".into());
                }
                (_, "one" | "single", Some("sentence" | "line" | "word" | "paragraph")) => {
                    asks.formats
                        .insert(format!("one {}", next.unwrap_or_default()));
                }
                (Some("step"), "by", Some("step")) => {
                    asks.formats.insert("step by step".into());
                }
                (Some("in"), "detail", _) | (Some("in"), "depth", _) => {
                    asks.formats.insert("detailed".into());
                }
                (Some("simple"), "terms", _) | (Some("plain"), "english", _) => {
                    asks.formats.insert("simple".into());
                }
                (Some("code"), "only", _) | (Some("only"), "code", _) => {
                    asks.formats.insert("code only".into());
                }
                (Some("in" | "into" | "to"), language, _) if LANGUAGES.contains(&language) => {
                    asks.formats.insert(format!("in {language}"));
                }
                _ => {}
            }
        }
    }
}

/// The task a task noun names when it follows a verb of producing: "(me) a summary", "an
/// explanation"; at most three words on ("me a short summary").
fn task_noun(rest: &[String]) -> Option<&'static str> {
    rest.iter()
        .take(4)
        .find_map(|w| TASK_NOUNS.iter().find(|(n, _)| n == w).map(|(_, k)| *k))
}

/// Whether the word after an adverb of register leaves it about the answer: nothing, grammar, or a
/// verb of saying ("briefly explain", "formally write").
fn of_the_answer(next: &str) -> bool {
    super::direction::is_function_word(next)
        || LEAD_IN.contains(&next)
        || TASKS.iter().any(|(_, verbs)| verbs.contains(&next))
        || matches!(
            next,
            "say"
                | "answer"
                | "reply"
                | "respond"
                | "tell"
                | "put"
                | "phrase"
                | "word"
                | "state"
                | "thanks"
                | "thank"
        )
}

/// Whether `word` opens another part of the request: "also" after "and" ("and also"), "as well
/// as", "in addition", "additionally", or "and" before a verb of asking or a question word. "and"
/// between two nouns ("salt and pepper") joins things, not requests.
fn opens_part(prev: Option<&str>, word: &str, next: Option<&str>) -> bool {
    match (prev, word, next) {
        (Some("and"), "also", _) | (Some("as"), "well", Some("as")) => true,
        (Some("in"), "addition", _) | (_, "additionally", _) => true,
        (_, "and", Some(n)) => {
            PART_VERBS.contains(&n) || QUESTION_WORDS.contains(&n) || n == "then"
        }
        _ => false,
    }
}

/// "Summarize and then translate it": a conjunction opens the next verb of the same request.
fn is_conjunction(word: &str) -> bool {
    matches!(word, "then" | "and")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(text: &str) -> Asks {
        Asks::of(text)
    }

    #[test]
    fn task_verbs_count_at_the_head_of_a_request() {
        assert_eq!(
            asks("Summarize this contract").tasks,
            BTreeSet::from(["summarize"])
        );
        assert_eq!(
            asks("Could you please translate this contract").tasks,
            BTreeSet::from(["translate"])
        );
        assert_eq!(
            asks("I want you to list the risks").tasks,
            BTreeSet::from(["list"])
        );
        assert_eq!(
            asks("Describe the water cycle").tasks,
            asks("Explain the water cycle").tasks
        );
        assert!(asks("What is a linked list?").tasks.is_empty());
        assert!(asks("Where is the summary page?").tasks.is_empty());
        assert_eq!(
            asks("Here is my essay. Proofread it, then summarize it.").tasks,
            BTreeSet::from(["rewrite", "summarize"])
        );
    }

    #[test]
    fn formats_languages_and_registers_are_read() {
        assert_eq!(
            asks("List the planets as JSON").formats,
            BTreeSet::from(["json".into()])
        );
        assert_eq!(
            asks("Show it in a table").formats,
            BTreeSet::from(["table".into()])
        );
        assert!(asks("What is a hash table?").formats.is_empty());
        assert_eq!(
            asks("Translate it into French").formats,
            BTreeSet::from(["in french".into()])
        );
        assert!(asks("Translate it into English").formats.is_empty());
        assert_eq!(
            asks("Explain it in one sentence").formats,
            BTreeSet::from(["one sentence".into()])
        );
        assert_eq!(
            asks("Explain it briefly").formats,
            asks("Give a concise explanation").formats
        );
        assert_eq!(
            asks("Explain step by step").formats,
            BTreeSet::from(["step by step".into()])
        );
        assert!(asks("What is the capital of France?").formats.is_empty());
        assert!(asks("How do I cancel a table reservation?")
            .formats
            .is_empty());
        assert!(asks("How do I raise a formal grievance?")
            .formats
            .is_empty());
        assert!(asks("Show me a detailed map of Paris").formats.is_empty());
        assert_eq!(
            asks("Keep it short").formats,
            BTreeSet::from(["brief".into()])
        );
    }
}
