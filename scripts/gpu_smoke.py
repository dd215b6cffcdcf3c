"""The GPU smoke checks, from a checkout: the same as `stare-agents gpu-smoke` (stare_agents/train/gpu_smoke.py,
which ships in the package; see its docstring for the tiers)."""

import sys

from stare_agents.train.gpu_smoke import main

if __name__ == "__main__":
    sys.exit(main())
