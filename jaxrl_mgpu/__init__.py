"""jaxrl_mgpu: reinforcement learning in JAX on every accelerator you give it."""

import time

__version__ = "0.1.0"

# When this process started using the package: the zero of the start-up times a run reports.
STARTED = time.monotonic()

# The algorithms a run may name, known to the options layer from the start (light: the built-ins'
# learners load when a run first names one).
from jaxrl_mgpu import algos  # noqa: E402,F401
