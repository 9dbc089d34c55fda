"""The client's one door to the agent: `Door` runs every agent tool on a target and hands back typed
replies read through agent/wire (tools.py); the commands as values (commands.py), the shipped copy of
gpuops/agent they run from (bundle.py), the tools held open (channels.py) and the replies (replies.py)."""

from gpuops.client.door.tools import ABORT_PERSISTENCE, Door

__all__ = ["ABORT_PERSISTENCE", "Door"]
