"""stare-agents: train and evaluate tool-using LLM agents with STARE."""

__version__ = "0.1.0"
