"""One transformer block's fused kernels at the AD size (4096 x 80 tokens, d_model 128, 4 heads,
bf16), forward and backward, called twice: a small program for Nsight Compute (ncu.sh), which
profiles the second call's six launches (attention forward, MLP forward, MLP rows, MLP weights,
attention backward, attention input gradient). The whole training step under ncu, on an H100,
gave a segmentation fault and then a compile that had not finished after 10 minutes."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu.nets import fused_attention, fused_mlp
from jaxrl_mgpu.nets.transformer import rope_tables

B, L, D, H, F = 4096, 80, 128, 4, 512
rng = np.random.default_rng(0)
f32 = lambda *s, c=0.0, sd=1.0: jnp.asarray(c + sd * rng.normal(size=s), jnp.float32)
attn_params = (f32(D, c=1.0, sd=0.2), f32(D, sd=0.2), f32(D, 3 * D, sd=D ** -0.5), f32(3 * D, sd=0.3))
mlp_params = (f32(D, D, sd=D ** -0.5), f32(D, sd=0.1), f32(D, c=1.0, sd=0.2), f32(D, sd=0.2),
              f32(D, F, sd=D ** -0.5), f32(F, sd=0.1), f32(F, D, sd=F ** -0.5), f32(D, sd=0.1))
cos, sin = rope_tables(jnp.arange(L), D // H, jnp.bfloat16)
x = f32(B, L, D).astype(jnp.bfloat16)


def block(x, attn_params, mlp_params):
    o, x = fused_attention.attend(x, *attn_params, cos, sin, None, None, L, H)
    return fused_mlp.finish_block(x, o.reshape(x.shape), *mlp_params)


@jax.jit
def step(x, attn_params, mlp_params):
    y, pull = jax.vjp(block, x, attn_params, mlp_params)
    return pull(y)


for _ in range(2):
    jax.block_until_ready(step(x, attn_params, mlp_params))
print("done")
