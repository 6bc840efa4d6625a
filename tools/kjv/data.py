"""The corpus: the King James Bible from the Debian program `bible`, chapters as documents, the split.

`bible -f "Gen1:1-Rev22:21"` prints every verse on one line as "<Book><chapter>:<verse> <text>"
(e.g. "Ge1:1 In the beginning ...", "1Sam3:4 ..."). A document is one chapter: the reference of each
verse is stripped and the verses are joined with a newline (no trailing newline), so the model sees one
verse per line. Chapters are numbered 0..1188 in canonical order; chapter i is held out iff
i % 40 == 39 (29 chapters), the rest is the training split. Token files hold the documents' token ids
(uint16), each document followed by <|endoftext|>.

Training batches are windows of seq_len + 2 consecutive tokens at offsets drawn from a seeded numpy
PCG64 generator (uniform over all valid offsets), so a batch depends only on the seed and the step.
"""

import hashlib
import re
import shutil
import subprocess
import sys

import numpy as np
import torch

BIBLE_RANGE = "Gen1:1-Rev22:21"
EXPECTED_VERSES = 31102
EXPECTED_CHAPTERS = 1189
HOLDOUT_EVERY = 40
VERSE_JOINER = "\n"
SPLIT_RULE = f"chapter i (0-based, canonical order) is held out iff i % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1}"
_VERSE_RE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def bible_program():
    """Path of the `bible` program, or exit with the install hint."""
    path = shutil.which("bible")
    if path is None:
        sys.exit("the program `bible` was not found; install it with: apt-get install bible-kjv")
    return path


def bible_version():
    """The installed bible-kjv package version (for data.json), or None."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "bible-kjv"], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def extract_text():
    """The raw output of `bible -f Gen1:1-Rev22:21` (str)."""
    prog = bible_program()
    out = subprocess.run([prog, "-f", BIBLE_RANGE], capture_output=True, check=True)
    return out.stdout.decode("utf-8")


def parse_chapters(raw):
    """Raw verse lines -> list of ((book, chapter), [verse texts]) in canonical order."""
    chapters = []
    n_verses = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        m = _VERSE_RE.match(line)
        if m is None:
            raise ValueError(f"unexpected line from `bible`: {line[:80]!r}")
        key = (m.group(1), int(m.group(2)))
        text = m.group(4).strip()
        if not chapters or chapters[-1][0] != key:
            chapters.append((key, []))
        chapters[-1][1].append(text)
        n_verses += 1
    if n_verses != EXPECTED_VERSES or len(chapters) != EXPECTED_CHAPTERS:
        raise ValueError(f"expected {EXPECTED_VERSES} verses in {EXPECTED_CHAPTERS} chapters, "
                         f"got {n_verses} in {len(chapters)}")
    return chapters


def split_documents(chapters):
    """(train docs, heldout docs, heldout chapter names): documents are verse-joined chapter texts."""
    train, heldout, names = [], [], []
    for i, ((book, ch), verses) in enumerate(chapters):
        doc = VERSE_JOINER.join(verses)
        if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1:
            heldout.append(doc)
            names.append(f"{book}{ch}")
        else:
            train.append(doc)
    return train, heldout, names


def sha256_text(text):
    """Hex sha256 of a str encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def pack_documents(token_lists, eos_id):
    """Concatenate documents, each followed by eos, as a uint16 array."""
    total = sum(len(t) + 1 for t in token_lists)
    out = np.empty(total, dtype=np.uint16)
    pos = 0
    for toks in token_lists:
        out[pos:pos + len(toks)] = toks
        out[pos + len(toks)] = eos_id
        pos += len(toks) + 1
    return out


def load_tokens(path, device):
    """A token file (uint16 .npy) as an int64 tensor on device."""
    arr = np.load(path)
    if arr.dtype != np.uint16 or arr.ndim != 1:
        raise ValueError(f"{path}: expected a 1-D uint16 array, got {arr.dtype} {arr.shape}")
    return torch.from_numpy(arr.astype(np.int64)).to(device)


class WindowSampler:
    """Deterministic random windows of `width` tokens from a token tensor.

    Batch k of a sampler is a function of (seed, k) only: offsets come from one PCG64 stream.
    """

    def __init__(self, tokens, width, batch_size, seed):
        if tokens.numel() < width + 1:
            raise ValueError(f"token file too short ({tokens.numel()}) for windows of {width}")
        self.tokens = tokens
        self.width = width
        self.batch_size = batch_size
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.span = torch.arange(width, device=tokens.device)

    def next(self):
        """[batch_size, width] int64 on the tokens' device."""
        starts = self.rng.integers(0, self.tokens.numel() - self.width + 1, size=self.batch_size)
        starts = torch.from_numpy(starts.astype(np.int64)).to(self.tokens.device)
        return self.tokens[starts[:, None] + self.span[None, :]]


def heldout_windows(tokens, seq_len):
    """Non-overlapping windows [start, end) covering the whole held-out stream (last may be shorter)."""
    n = tokens.numel()
    return [(s, min(s + seq_len, n)) for s in range(0, n, seq_len) if min(s + seq_len, n) - s >= 3]
