"""Interleaved A/B of the AD-size training step (both kernels, bf16) with training's optimizer
(learner.adam: global-norm clipping + Adam) over the parameters flattened into one vector
(optax.flatten, the default) against the same chain per parameter leaf."""
import dataclasses
import optax
from jaxrl_mgpu import bench, config as config_lib

flatten = optax.flatten
cfg = config_lib.from_args(["--policy", "transformer", "--d-model", "128", "--n-layers", "4", "--n-heads", "4",
                            "--context-len", "80"])
cfg = dataclasses.replace(cfg, precision="bf16", attention="pallas", mlp="pallas")
ceiling = bench.matmul_ceiling(per_timing=10)
print(f"ceiling {ceiling:.0f} TFLOP/s", flush=True)
for round_ in range(2):
    for name, wrap in (("per-leaf", lambda tx: tx), ("flat", flatten)):
        optax.flatten = wrap
        row = bench.measure_transformer_step(cfg, 4096, 10, per_timing=10)
        print(f"{name:>10} round {round_}  {row['step_ms']:7.2f} ms  {row['tokens_per_s'] / 1e6:6.2f}M tok/s  "
              f"MFU {row['tflops'] / ceiling:6.1%}", flush=True)
