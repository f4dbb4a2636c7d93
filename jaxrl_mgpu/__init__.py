"""jaxrl_mgpu: reinforcement learning in JAX on every accelerator you give it."""

import time

__version__ = "0.1.0"

# When this process started using the package: the zero of the start-up times a run reports.
STARTED = time.monotonic()
