"""What is not the core of training, kept apart so that the package root shows the core: the
commands `bench` (with `reference_ppo`, the single-file PPO it times against), `launch`,
`histories` and `incontext`, and the extras the core calls at its edges: `autoscale`
(--auto-scale), `video` (evaluate --video) and `runstats` (the summary of many runs).

The commands keep their short names: `python -m jaxrl_mgpu.bench` runs `tools/bench.py`
through a few-line module at the package root.
"""
