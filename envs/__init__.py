"""Gymnasium environments for tool-using LLM agents, tool-call parsing and math grading.

    import gymnasium as gym
    import stare_agents.envs  # registers the stare_agents/* ids

    env = gym.make("stare_agents/MathTIR-v0", dataset="train.jsonl")
    obs, info = env.reset(seed=0)                  # obs: list of {"role", "content", "inline"} messages
    obs, reward, terminated, truncated, info = env.step(model_text)

Registered ids: stare_agents/MathTIR-v0, stare_agents/MathCoT-v0, stare_agents/ArithmeticTIR-v0,
stare_agents/ArithmeticTIR-v1, stare_agents/PythonUnitTest-v0. New environments subclass `TextEnv` or `ToolEnv` (see `core`), and
`check_env` checks them. Tools are objects (`PythonTool(sandbox, ...)`, `Tool`); environments made without a
sandbox share `shared_sandbox()`; grading runs in a `MathGrader` pool (`default_grader()` per process).
"""

from stare_agents.envs.arithmetic import ArithmeticTIREnv, ArithmeticTIRV1Env
from stare_agents.envs.checker import EnvCheckError, check_env
from stare_agents.envs.core import (
    FINAL_INFO_KEYS,
    INFO_KEYS,
    MessagesSpace,
    Score,
    TextEnv,
    ToolEnv,
    UnicodeText,
    load_prompt,
)
from stare_agents.envs.grading import (
    GradeResult,
    GraderStats,
    MathGrader,
    default_grader,
    extract_boxed,
    final_boxes,
    grade_answer,
)
from stare_agents.envs.math_envs import MathCoTEnv, MathTIREnv
from stare_agents.envs.parsing import (
    Message,
    ToolCall,
    find_tool_calls,
    format_inline,
    hermes_calls,
    message,
    python_blocks,
    truncate_middle,
)
from stare_agents.envs.python_unittest import PythonUnitTestEnv
from stare_agents.envs.registration import ENVIRONMENTS, register_envs
from stare_agents.envs.tasks import Task, TaskDataset, load_rows, unique_tasks
from stare_agents.envs.tools import PythonTool, Tool, ToolLike, ToolOutput, shared_sandbox

register_envs()

__all__ = [
    "ENVIRONMENTS",
    "FINAL_INFO_KEYS",
    "INFO_KEYS",
    "ArithmeticTIREnv",
    "ArithmeticTIRV1Env",
    "EnvCheckError",
    "GradeResult",
    "GraderStats",
    "MathCoTEnv",
    "MathGrader",
    "MathTIREnv",
    "Message",
    "MessagesSpace",
    "PythonTool",
    "PythonUnitTestEnv",
    "Score",
    "Task",
    "TaskDataset",
    "TextEnv",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolLike",
    "ToolOutput",
    "UnicodeText",
    "check_env",
    "default_grader",
    "extract_boxed",
    "final_boxes",
    "find_tool_calls",
    "format_inline",
    "grade_answer",
    "hermes_calls",
    "load_prompt",
    "load_rows",
    "message",
    "python_blocks",
    "register_envs",
    "shared_sandbox",
    "truncate_middle",
    "unique_tasks",
]
