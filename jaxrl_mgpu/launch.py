"""`python -m jaxrl_mgpu.launch`: several training processes on this machine, as one job. The
command keeps its name here; its code is tools/launch.py."""

import sys

from jaxrl_mgpu.tools.launch import main

if __name__ == "__main__":
    sys.exit(main())
