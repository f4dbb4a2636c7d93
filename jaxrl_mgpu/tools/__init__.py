"""What is not the core of training, kept apart so that the package root shows the core: the
commands `bench` (with `reference_ppo`, the single-file PPO it times against), `launch`,
`histories` (AD's source learners, algos/ad/histories.py, written as a dataset) and `incontext`,
and what `evaluate` adds at its edges: `video` (evaluate --video) and `incontext` (evaluate
--in-context). The core imports nothing from here (tests/test_imports.py checks the layers).

The commands keep their short names: `python -m jaxrl_mgpu.bench` runs `tools/bench.py`
through a few-line module at the package root.
"""
