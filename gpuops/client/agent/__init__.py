"""The client's one door to the agent: `Agent` runs every agent tool on a target and hands back typed
replies read through agent/wire (door.py); the commands as values (commands.py), the shipped copy of
gpuops/agent they run from (bundle.py), the tools held open (channels.py) and the replies (replies.py)."""

from gpuops.client.agent.door import ABORT_PERSISTENCE, Agent

__all__ = ["ABORT_PERSISTENCE", "Agent"]
