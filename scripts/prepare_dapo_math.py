"""DAPO-Math-17k as the math environments' JSONL, from a checkout: the same as
`stare-agents envs prepare-dapo-math` (stare_agents/envs/dapo_math.py, which ships in the package)."""

import sys

from stare_agents.envs.dapo_math import main

if __name__ == "__main__":
    sys.exit(main())
