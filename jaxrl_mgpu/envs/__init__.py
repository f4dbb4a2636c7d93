"""Environments: every gymnax name, the project's own jittable environments, a user's own
(`register`), and other suites' tasks as `SUITE:TASK` (`brax:ant`, `craftax:...`).

The registry and the interface every environment follows are in `registry.py`; the adapters of
the other suites (atari.py, brax_state.py, old_gymnax.py, timestep.py) and the project's own environments
(darkroom.py, pomdp.py, tag.py) register themselves there when this package is imported.
"""

from jaxrl_mgpu.envs.registry import (COUNT, FLAG, FLOAT32_MAX, INT32_MAX, POSITIVE, REAL, Arg, EnvError, Suite,
                                      arguments, check, check_env_step, check_episode_metrics, episode_metrics,
                                      is_multi_agent, make, names, parse_args, register, register_suite, traits, Traits)
from jaxrl_mgpu.envs import atari, brax_state, darkroom, old_gymnax, pomdp, tag, timestep  # noqa: E402,F401  (they register)

__all__ = ["COUNT", "FLAG", "FLOAT32_MAX", "INT32_MAX", "POSITIVE", "REAL", "Arg", "EnvError", "Suite", "arguments",
           "check", "check_env_step", "check_episode_metrics", "episode_metrics", "is_multi_agent", "make", "names",
           "parse_args", "register", "register_suite", "traits", "Traits"]
