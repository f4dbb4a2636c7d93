"""jaxrl_mgpu: reinforcement learning in JAX on every accelerator you give it."""

__version__ = "0.1.0"
