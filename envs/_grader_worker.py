"""Math-grading worker process: reads JSON requests on stdin, writes JSON replies on stdout.

Run by `stare_agents.envs.grading.MathGrader` as `python <this file> <memory_limit_bytes>`, by path rather
than as a module so that the package (gymnasium, the sandbox client) is not imported here. One request per
line: `{"answer": str, "reference": str, "soft_timeout_s": float}`; one reply per line:
`{"reason": "correct" | "wrong" | "parse_failure" | "timeout", "detail": str}`.

A SIGALRM deadline interrupts pure-Python work (most of sympy) and answers "timeout" while the worker lives
on; work stuck in C code ignores the signal, and then the parent's hard timeout kills this process.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys


class _Deadline(BaseException):
    """Raised by SIGALRM. A BaseException so that math-verify's `except Exception` cannot swallow it."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Deadline


def main() -> None:
    # Run by path, Python puts this folder first on sys.path; drop it so our module names shadow nothing.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    memory_limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if memory_limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    logging.disable(logging.CRITICAL)  # math-verify logs every failed parse; replies carry the reason

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    extraction = [LatexExtractionConfig(), ExprExtractionConfig()]

    def grade(answer: str, reference: str) -> dict[str, str]:
        gold = parse("\\boxed{" + reference + "}", extraction_config=extraction, parsing_timeout=None)
        if not gold:
            return {"reason": "parse_failure", "detail": "reference could not be parsed"}
        pred = parse("\\boxed{" + answer + "}", extraction_config=extraction, parsing_timeout=None)
        if not pred:
            return {"reason": "parse_failure", "detail": "answer could not be parsed"}
        correct = verify(gold, pred, timeout_seconds=None)
        return {"reason": "correct" if correct else "wrong", "detail": ""}

    grade("\\frac{1}{2}", "0.5")  # warm up (lazy imports, the LaTeX parser) before the first timed request
    signal.signal(signal.SIGALRM, _on_alarm)
    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, max(0.01, float(request["soft_timeout_s"])))
            try:
                reply = grade(request["answer"], request["reference"])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Deadline:
            reply = {"reason": "timeout", "detail": "interrupted by the worker's deadline"}
        except MemoryError:
            reply = {"reason": "parse_failure", "detail": "memory limit exceeded while grading"}
        except Exception as error:  # anything sympy/latex2sympy raises is a property of the input
            reply = {"reason": "parse_failure", "detail": f"{type(error).__name__}: {str(error)[:200]}"}
        out.write(json.dumps(reply, allow_nan=False) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
