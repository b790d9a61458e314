"""TRACE's per-task metrics on generated answers: pure Python, no torch, no downloads.

Each function reproduces what TRACE's repository (BeyonderXX/TRACE at the commit named in
`mini_trainer.data.trace`, `metrics.py` and `evaluations/eval_*.py`) computes with its
dependencies, so numbers compare with the paper's:

- accuracy (C-STANCE, FOMC, NumGLUE-cm, NumGLUE-ds): the generated string equals the answer
  exactly (no stripping, no case folding); ScienceQA compares the first character only (the
  option letter; the rest is the reasoning).
- ROUGE-L (MeetingBank): the `rouge` package 1.0.1's summary-level ROUGE-L F, as TRACE calls
  it (`Rouge().get_scores(answer, prediction)`): texts split into sentences at every ".", words
  at single spaces, and word sets (its `exclusive` n-grams: each distinct word counts once).
- edit similarity (Py150): `fuzzywuzzy.fuzz.ratio` without python-Levenshtein (TRACE's
  requirements do not install it), i.e. `round(100 * difflib.SequenceMatcher(None, a, b).ratio())`,
  after TRACE's literal post-processing (`<NUM_LIT>` -> `0`, `<STR_LIT:x>` -> `x`, ...).
- SARI (20Minuten): the Hugging Face `sari` metric (Xu et al. 2016 with its two fixes), sources
  being the prompts, one reference per sample, each text lowercased and tokenized by sacrebleu's
  `13a` tokenizer (reimplemented here).

As in TRACE, a sample whose prediction or answer is empty scores 0 but still counts in the mean.
Every score is returned on [0, 1] (TRACE prints accuracy and ROUGE-L times 100, and similarity
and SARI on 0..100 already), so that a task's score and TRACE's overall performance (OP, the
mean over tasks) and BWT are read off one accuracy-like matrix, like the report's AA and BWT.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Callable, Sequence

# -------------------------------------------------------------------------------- accuracy


def accuracy(predictions: Sequence[str], answers: Sequence[str]) -> float:
    """Share of samples whose prediction equals the answer exactly (TRACE's `caculate_accuracy`)."""
    _same_length(predictions, answers)
    hits = sum(1 for p, a in zip(predictions, answers, strict=True) if p and a and p == a)
    return hits / len(predictions)


def first_character_accuracy(predictions: Sequence[str], answers: Sequence[str]) -> float:
    """ScienceQA: accuracy of the first character (the option letter) of each text."""
    return accuracy([p[:1] for p in predictions], [a[:1] for a in answers])


# --------------------------------------------------------------------------------- ROUGE-L


def _sentences(text: str) -> list[str]:
    """The `rouge` package's split: at every ".", whitespace runs collapsed, empty pieces kept
    only when they held whitespace (as it does)."""
    return [" ".join(piece.split()) for piece in text.split(".") if len(piece) > 0]


def _lcs_words(x: list[str], y: list[str]) -> set[str]:
    """The words of the longest common subsequence of x and y that the `rouge` package
    reconstructs (its DP table and its tie-break: up when strictly longer, else left), as a set."""
    n, m = len(x), len(y)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            if x[i - 1] == y[j - 1]:
                table[i][j] = table[i - 1][j - 1] + 1
            else:
                table[i][j] = max(table[i - 1][j], table[i][j - 1])
    words, i, j = set(), n, m
    while i > 0 and j > 0:
        if x[i - 1] == y[j - 1]:
            words.add(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def rouge_l(hypothesis: str, reference: str) -> float:
    """Summary-level ROUGE-L F of two texts, as `rouge.Rouge(metrics=["rouge-l"])` 1.0.1 scores
    `get_scores(hypothesis, reference)`; 0.0 where that package would refuse a text with no
    sentence (e.g. "...")."""
    hyp, ref = _sentences(hypothesis), _sentences(reference)
    if not hyp or not ref:
        return 0.0
    ref_words = {w for s in ref for w in s.split(" ")}
    hyp_words = {w for s in hyp for w in s.split(" ")}
    union: set[str] = set()
    for ref_sentence in ref:
        for hyp_sentence in hyp:
            union |= _lcs_words(ref_sentence.split(" "), hyp_sentence.split(" "))
    recall, precision = len(union) / len(ref_words), len(union) / len(hyp_words)
    return 2.0 * ((precision * recall) / (precision + recall + 1e-8))


def mean_rouge_l(predictions: Sequence[str], answers: Sequence[str]) -> float:
    """TRACE's `caculate_rouge`: ROUGE-L F of (answer, prediction) per sample, the mean."""
    _same_length(predictions, answers)
    total = sum(rouge_l(a, p) for p, a in zip(predictions, answers, strict=True) if p and a)
    return total / len(predictions)


# ------------------------------------------------------------------------- edit similarity

_LITERAL = re.compile(r"<(STR|NUM|CHAR)_LIT:(.*?)>", re.S)


def py150_postprocess(code: str) -> str:
    """TRACE's `eval_Py150.postprocess`: literal placeholders back to code."""
    code = code.replace("<NUM_LIT>", "0").replace("<STR_LIT>", "").replace("<CHAR_LIT>", "")
    for kind, value in _LITERAL.findall(code):
        code = code.replace(f"<{kind}_LIT:{value}>", value)
    return code


def fuzz_ratio(a: str, b: str) -> int:
    """`fuzzywuzzy.fuzz.ratio` (pure-Python path): 100 for equal strings, 0 if either is empty,
    else `round(100 * SequenceMatcher(None, a, b).ratio())` (difflib's defaults, autojunk on)."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def edit_similarity(predictions: Sequence[str], answers: Sequence[str]) -> float:
    """Py150: mean `fuzz_ratio` of the post-processed texts, over 100 (so on [0, 1])."""
    _same_length(predictions, answers)
    pairs = [
        (py150_postprocess(p), py150_postprocess(a))
        for p, a in zip(predictions, answers, strict=True)
    ]
    total = sum(fuzz_ratio(p, a) for p, a in pairs if p and a)
    return total / len(predictions) / 100


# ------------------------------------------------------------------------------------ SARI

_13A_RULES = [
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
]


def tokenize_13a(line: str) -> str:
    """sacrebleu's `13a` tokenizer (mteval-v13a): punctuation split off, single spaces."""
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&")
        line = line.replace("&lt;", "<").replace("&gt;", ">")
    line = f" {line} "
    for pattern, replacement in _13A_RULES:
        line = pattern.sub(replacement, line)
    return " ".join(line.split())


def _ngrams(words: list[str], n: int) -> list[str]:
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)] if n > 1 else words


def _sari_ngram(source: list[str], candidate: list[str], references: list[list[str]]):
    """(keep F1, deletion precision, addition F1) for one n-gram order (the `sari` metric's
    `SARIngram`, counts of source and candidate scaled by the number of references)."""
    numref = len(references)
    ref_counts = Counter(g for grams in references for g in grams)
    src_rep = Counter({g: c * numref for g, c in Counter(source).items()})
    cand_rep = Counter({g: c * numref for g, c in Counter(candidate).items()})

    keep = src_rep & cand_rep
    keep_good = keep & ref_counts
    keep_all = src_rep & ref_counts
    keep_precision = sum(keep_good[g] / keep[g] for g in keep_good) / len(keep) if keep else 1
    keep_recall = sum(keep_good.values()) / sum(keep_all.values()) if keep_all else 1
    keep_f = _f1(keep_precision, keep_recall)

    deleted = src_rep - cand_rep
    deleted_good = deleted - ref_counts
    del_precision = (
        sum(deleted_good[g] / deleted[g] for g in deleted_good) / len(deleted) if deleted else 1
    )

    added = set(cand_rep) - set(src_rep)
    added_good = added & set(ref_counts)
    added_all = set(ref_counts) - set(src_rep)
    add_precision = len(added_good) / len(added) if added else 1
    add_recall = len(added_good) / len(added_all) if added_all else 1
    return keep_f, del_precision, _f1(add_precision, add_recall)


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision > 0 or recall > 0 else 0.0


def sari_sentence(source: str, candidate: str, references: Sequence[str]) -> float:
    """SARI of one sample on [0, 1]: the mean over n = 1..4 of keep, deletion and addition,
    on lowercased, 13a-tokenized texts split at single spaces."""
    src, cand = (tokenize_13a(t.lower()).split(" ") for t in (source, candidate))
    refs = [tokenize_13a(r.lower()).split(" ") for r in references]
    scores = [
        _sari_ngram(_ngrams(src, n), _ngrams(cand, n), [_ngrams(r, n) for r in refs])
        for n in (1, 2, 3, 4)
    ]
    return sum(sum(s[k] for s in scores) / 4 for k in range(3)) / 3


def mean_sari(sources: Sequence[str], predictions: Sequence[str], answers: Sequence[str]) -> float:
    """20Minuten: mean SARI over samples, each answer the one reference (on [0, 1])."""
    _same_length(predictions, answers)
    _same_length(sources, answers)
    triples = zip(sources, predictions, answers, strict=True)
    total = sum(sari_sentence(s, p, [a]) for s, p, a in triples)
    return total / len(predictions)


# ------------------------------------------------------------------------------- per task


def _same_length(first: Sequence[str], second: Sequence[str]) -> None:
    if len(first) != len(second) or not first:
        raise ValueError(f"need as many predictions as answers, and some: {len(first)}, "
                         f"{len(second)}")  # fmt: skip


TaskMetric = Callable[[Sequence[str], Sequence[str], Sequence[str]], float]

TASK_METRICS: dict[str, tuple[str, TaskMetric]] = {
    "C-STANCE": ("accuracy", lambda s, p, a: accuracy(p, a)),
    "FOMC": ("accuracy", lambda s, p, a: accuracy(p, a)),
    "MeetingBank": ("rouge_l", lambda s, p, a: mean_rouge_l(p, a)),
    "Py150": ("edit_similarity", lambda s, p, a: edit_similarity(p, a)),
    "ScienceQA": ("accuracy", lambda s, p, a: first_character_accuracy(p, a)),
    "NumGLUE-cm": ("accuracy", lambda s, p, a: accuracy(p, a)),
    "NumGLUE-ds": ("accuracy", lambda s, p, a: accuracy(p, a)),
    "20Minuten": ("sari", mean_sari),
}
"""TRACE task -> (metric name, metric of (prompts, predictions, answers)): the paper's one
score per task, the one OP and BWT average."""


def task_score(
    task: str, prompts: Sequence[str], predictions: Sequence[str], answers: Sequence[str]
) -> dict:
    """`{"metric": name, "score": value, "num_samples": n}` of one TRACE task."""
    if task not in TASK_METRICS:
        raise ValueError(f"unknown TRACE task {task!r} (known: {', '.join(TASK_METRICS)})")
    name, metric = TASK_METRICS[task]
    return {"metric": name, "score": metric(prompts, predictions, answers),
            "num_samples": len(predictions)}  # fmt: skip
