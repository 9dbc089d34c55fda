"""gpuops: run GPU training jobs in Proxmox LXC containers over SSH and stop them when they go wrong.

Importing this package is cheap on purpose: heavy dependencies are imported where they are used.
"""

__version__ = "0.1.0"
