#!/usr/bin/env python3
"""Turns WordNet 3.0 (Debian's wordnet-base) into the table of names the `entity` and `template` guards read.

Writes, sorted, one line per entry:
  `= a b c`  one-word names of one synset, lowercased, dots removed ("america us usa", "prague praha"):
             the same place, person or thing under another name, so not another entity;
  `p word`   a word of four letters or more that WordNet knows only as a proper noun (only capitalized
             lemmas, in no part of speech a common lemma or a regular inflection of one): "paris",
             "tolstoy", "nebraska". Typed in lower case it is still a name, which a capital cannot show.
             Shorter ones are mostly acronyms that spell a common word in lower case ("WHO", "AAA").
Usage: wordnet-names.py [WORDNET_DIR] > server/assets/wordnet-names.txt
"""
import re
import sys

DIR = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/wordnet"
WORD = re.compile(r"^[a-z]+(-[a-z]+)?$")
# Regular inflections, undone as WordNet's morphy does, so "states" (of "state") is not a name.
SUFFIXES = [("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("ies", "y"),
            ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", ""), ("er", ""), ("est", ""),
            ("er", "e"), ("est", "e"), ("men", "man")]

common, proper, synonyms = set(), set(), set()
for name in ("noun", "verb", "adj", "adv"):
    with open(f"{DIR}/data.{name}", encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue  # the license header
            fields = line.split(" | ")[0].split()
            count = int(fields[3], 16)
            raw = [fields[4 + 2 * i].split("(")[0] for i in range(count)]
            names = set()
            for word in raw:
                bare = word.lower().replace(".", "")
                if word[0].isupper():
                    proper.add(bare)
                    if WORD.match(bare):
                        names.add(bare)
                else:
                    common.add(bare)
            if len(names) >= 2:
                synonyms.add(tuple(sorted(names)))
    with open(f"{DIR}/{name}.exc", encoding="latin-1") as f:
        common.update(line.split()[0] for line in f)


def inflected(word):
    return any(word.endswith(s) and word[: len(word) - len(s)] + e in common for s, e in SUFFIXES)


only_proper = sorted(w for w in proper if WORD.match(w) and len(w) >= 4 and w not in common and not inflected(w))
print("# Names from WordNet 3.0 (Princeton University; license in README), made by scripts/wordnet-names.py.")
for names in sorted(synonyms):
    print("= " + " ".join(names))
for word in only_proper:
    print(f"p {word}")
