"""Interleaved A/B of kernel settings on the AD-size training step (one GPU): each variant sets
module constants of jaxrl_mgpu.nets.* before the step is traced, and every variant is timed
`--rounds` times in turn (so drift on the card hits all of them alike).

    python experiments/gpu/variants.py base "g132:fused_attention.INPUT_GROUPS=132" ...

A variant is NAME or NAME:module.CONSTANT=value[;module.CONSTANT=value...] (values are Python
literals, or partial(keyword=literal, ...) to call a module's function with those keyword
arguments, e.g. "mb32:fused_attention.attend=partial(max_block=32)"); every variant starts from
the defaults."""
import argparse
import ast
import dataclasses
import functools
import importlib

from jaxrl_mgpu import bench, config as config_lib

parser = argparse.ArgumentParser()
parser.add_argument("variants", nargs="+")
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--batch", type=int, default=4096)
args = parser.parse_args()

variants = []
for spec in args.variants:
    name, _, sets = spec.partition(":")
    overrides = []
    for item in filter(None, sets.split(";")):
        target, value = item.split("=", 1)
        module, constant = target.rsplit(".", 1)
        module = importlib.import_module(f"jaxrl_mgpu.nets.{module}")
        if not hasattr(module, constant):  # setattr would add it unused and time the base twice
            parser.error(f"{spec}: jaxrl_mgpu.nets.{module.__name__.rsplit('.', 1)[1]} has no {constant}")
        if value.startswith("partial("):
            keywords = {k.arg: ast.literal_eval(k.value) for k in ast.parse(value, mode="eval").body.keywords}
            value = functools.partial(getattr(module, constant), **keywords)
        else:
            value = ast.literal_eval(value)
        overrides.append((module, constant, value))
    variants.append((name, overrides))
defaults = {(m, c): getattr(m, c) for _, o in variants for m, c, _ in o}

cfg = config_lib.from_args(["--policy", "transformer", "--d-model", "128", "--n-layers", "4", "--n-heads",
                            str(args.heads), "--context-len", "80"])
cfg = dataclasses.replace(cfg, precision="bf16", attention="pallas", mlp="pallas")
ceiling = bench.matmul_ceiling(per_timing=10)
print(f"ceiling {ceiling:.0f} TFLOP/s", flush=True)
for round_ in range(args.rounds):
    for name, overrides in variants:
        for (m, c), v in defaults.items():
            setattr(m, c, v)
        for m, c, v in overrides:
            setattr(m, c, v)
        row = bench.measure_transformer_step(cfg, args.batch, 10, per_timing=10)
        print(f"{name:>24} round {round_}  {row['step_ms']:7.2f} ms  {row['tokens_per_s'] / 1e6:6.2f}M tok/s  "
              f"MFU {row['tflops'] / ceiling:6.1%}  spread {row['spread']:.2f}", flush=True)
