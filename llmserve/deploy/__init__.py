"""`llmserve deploy`: red-black and versioned rollouts on the local target (processes + gateway), state in SQLite.

Public surface: Deployer (deploy, rollback, down, recover), DeployOptions, status_of, StateStore.
"""

from llmserve.deploy.rollout import DEFAULT_STEPS, RED_BLACK, VERSIONED, Deployer, DeployOptions, parse_steps, status_of
from llmserve.deploy.state import StateStore, default_state_dir

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
