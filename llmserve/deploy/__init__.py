"""`llmserve deploy`: red-black and versioned rollouts on the local target (processes + gateway), state in SQLite.

Public surface: Deployer (deploy, rollback, down, recover), DeployOptions, status_of, StateStore.
"""

from llmserve.deploy.options import DeployOptions, parse_steps
from llmserve.deploy.rollout import Deployer, status_of
from llmserve.deploy.state import StateStore, default_state_dir
from llmserve.deploy.strategy import DEFAULT_STEPS, RED_BLACK, VERSIONED

__all__ = [
    "DEFAULT_STEPS",
    "RED_BLACK",
    "VERSIONED",
    "DeployOptions",
    "Deployer",
    "StateStore",
    "default_state_dir",
    "parse_steps",
    "status_of",
]
