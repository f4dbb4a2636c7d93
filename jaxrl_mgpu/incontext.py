"""`python -m jaxrl_mgpu.incontext`: in-context evaluation of Algorithm Distillation. The command
keeps its name here; its code is tools/incontext.py."""

import sys

from jaxrl_mgpu.tools.incontext import main

if __name__ == "__main__":
    sys.exit(main())
