"""Session 16: the packed fp16 approximations (two elements an instruction) against fp32 on a
GPU, inside a Pallas kernel (pallas_util.ptx_approx): max abs error of tanh.approx.f16x2 and ex2.approx.f16x2 against
jnp.tanh / jnp.exp2 over the ranges the GELU gate and the softmax see, next to the fp32
approximations the kernels use now."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxrl_mgpu.nets.pallas_util import ptx_approx


def run(fn, x):
    def kernel(x_ref, y_ref):
        y_ref[...] = fn(x_ref[...])
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32))(x)


for name, exact, lo, hi in [("tanh", jnp.tanh, -12.0, 12.0), ("ex2", jnp.exp2, -30.0, 0.0)]:
    x = jnp.linspace(lo, hi, 1 << 16, dtype=jnp.float32).reshape(256, 256)
    ref = exact(x)
    for kind, fn in [("f32", lambda v: ptx_approx(f"{name}.approx.f32", v)),
                     ("f16x2", lambda v: ptx_approx(f"{name}.approx.f16x2", v))]:
        err = jnp.abs(run(fn, x) - ref)
        rel = err / jnp.maximum(jnp.abs(ref), 1e-30)
        print(f"{name}.approx.{kind:6s} over [{lo}, {hi}]: max abs error {float(err.max()):.2e}, "
              f"max rel error where |y| > 1e-3 {float(jnp.where(jnp.abs(ref) > 1e-3, rel, 0).max()):.2e}")
