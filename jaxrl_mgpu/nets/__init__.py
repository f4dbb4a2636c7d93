"""Policy networks. `--policy mlp` is a feedforward actor-critic (with a small conv torso,
chosen automatically, for image observations such as MinAtar's)."""

import jax.numpy as jnp

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


def compute_dtype(precision: str):
    """The dtype networks compute in for `--precision` (params stay float32)."""
    return DTYPES[precision]


def kernels(cfg) -> dict:
    """`--attention` and `--mlp` as TransformerActorCritic arguments."""
    return {"attn_implementation": None if cfg.attention == "xla" else cfg.attention,
            "mlp_implementation": None if cfg.mlp == "xla" else cfg.mlp}
