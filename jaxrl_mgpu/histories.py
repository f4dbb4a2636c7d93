"""`python -m jaxrl_mgpu.histories`: learning histories of a source algorithm, for Algorithm
Distillation. The command keeps its name here; its code is tools/histories.py."""

import sys

from jaxrl_mgpu.tools.histories import main

if __name__ == "__main__":
    sys.exit(main())
