# learner side (learner.py, policy.py, sft.py, distributed.py, checkpoint.py): explicit re-exports
from stare_agents.train.checkpoint import checkpoint_path as checkpoint_path
from stare_agents.train.checkpoint import latest_checkpoint as latest_checkpoint
from stare_agents.train.checkpoint import list_checkpoints as list_checkpoints
from stare_agents.train.checkpoint import load_checkpoint as load_checkpoint
from stare_agents.train.checkpoint import prune_checkpoints as prune_checkpoints
from stare_agents.train.checkpoint import save_checkpoint as save_checkpoint
from stare_agents.train.distributed import DistributedConfig as DistributedConfig
from stare_agents.train.distributed import LearnerGroup as LearnerGroup
from stare_agents.train.learner import LEARNER_METRICS as LEARNER_METRICS
from stare_agents.train.learner import Learner as Learner
from stare_agents.train.learner import LearnerConfig as LearnerConfig
from stare_agents.train.policy import OptimizerConfig as OptimizerConfig
from stare_agents.train.policy import PolicyModel as PolicyModel
from stare_agents.train.policy import TokenStats as TokenStats
from stare_agents.train.sft import SFT_METRICS as SFT_METRICS
from stare_agents.train.sft import SFTConfig as SFTConfig
from stare_agents.train.sft import SFTTrainer as SFTTrainer
