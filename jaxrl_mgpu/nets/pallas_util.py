"""Small pieces the Pallas (Triton) kernels of fused_attention.py and fused_mlp.py share."""

import jax
import jax.numpy as jnp


def dot(a, b, trans_a=False, trans_b=False):
    """a @ b (either operand transposed) with fp32 accumulation, as Triton's tl.dot does it.
    (`pl.dot` is gone from jax 0.12; a dot_general lowers to the same tl.dot.)"""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def index(i: int):
    """An integer index into a ref, as a traced scalar: the interpreter (CPU tests) rejects a
    Python int there."""
    return jnp.int32(i)


def interpret() -> bool:
    """Whether to run the kernels through the Pallas interpreter: everywhere but on GPUs, where
    they compile to Triton (the interpreter is how the CPU tests run them)."""
    return jax.default_backend() != "gpu"
