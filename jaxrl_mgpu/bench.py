"""`python -m jaxrl_mgpu.bench`: steady-state training throughput. The command keeps its name here;
its code is tools/bench.py."""

import sys

from jaxrl_mgpu.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
