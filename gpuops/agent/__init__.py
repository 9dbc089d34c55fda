"""What runs ON the target (inside the container, beside the run): standard library only.

This package is shipped to the target as files (a content-hashed copy under
``~/.gpuops/lib/``, see ``gpuops.client.door.bundle``) and imported there as ``gpuops_agent``; here it is
``gpuops.agent``. So every module in it imports only the standard library and its siblings,
through relative imports, and runs on Python 3.8 (Ubuntu 20.04) and newer.
"""

import os

HOME = os.path.dirname(os.path.abspath(__file__))  # this package's folder
SH = os.path.join(HOME, "sh")  # its shell tools
LIB = os.path.dirname(HOME)  # the folder that holds it: on the target, ~/.gpuops/lib/<digest>
