"""Algorithms: each a package of per-device functions (ppo/, dqn/, sac/: SAC and TD3, ad/,
mappo/) with its options (a light module: the command line reads it without loading the
algorithm) and the frozen `Spec` that says everything the host reads of it (spec.py),
registered by name as `--algo NAME` (registry.py: the built-ins load on first use;
`--algo MODULE:NAME` and installed packages' entry points name others). Adding one is a module
and a `register` call (docs/algorithms.md); the plan (plan.py) picks the spec a run trains
with, once."""

from jaxrl_mgpu.algos.registry import get, names, register
from jaxrl_mgpu.algos.spec import Asynchronous, Spec

__all__ = ["Asynchronous", "Spec", "get", "names", "register"]
