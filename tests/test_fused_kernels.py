"""The Pallas kernels (nets/fused_attention.py, nets/fused_mlp.py, nets/fused_heads.py) against
plain jnp / XLA.

On CPU the kernels run through the Pallas interpreter (`interpret=True`; the transformer picks it
whenever the backend is not a GPU), which executes the same kernel bodies, masked loads and
stores and out-of-range tiles included, so these tests check the kernels' arithmetic, masking
and custom VJPs. Shapes are small: the interpreter is slow.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import make_stream, random_transformer_params

from jaxrl_mgpu.nets import fused_attention, fused_heads, fused_mlp
from jaxrl_mgpu.nets.transformer import TransformerActorCritic, rope, rope_tables

# ----------------------------------------------------------------------------------------------
# Helpers.


def assert_near(actual, desired, rtol=1e-5, what=""):
    """Elementwise |a - d| <= rtol * max|d| (+ a tiny floor): relative to the array's scale, so
    that near-zero entries of a gradient do not demand more than fp32 rounding can give."""
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    assert actual.shape == desired.shape, (what, actual.shape, desired.shape)
    scale = max(float(np.abs(desired).max(initial=0.0)), 1e-6)
    np.testing.assert_allclose(actual, desired, rtol=0, atol=rtol * scale, err_msg=what)


def assert_trees_near(actual, desired, rtol=1e-5):
    assert jax.tree.structure(actual) == jax.tree.structure(desired)
    for (path, a), d in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(desired)):
        assert_near(a, d, rtol, what=jax.tree_util.keystr(path))


# ----------------------------------------------------------------------------------------------
# 1. The transformer with both kernels == the XLA transformer, same params.

A, OBS = 3, 5
B, L, C = 3, 20, 6  # batch, sequence length, context_len (< L: the window mask matters)
# Episode starts: several inside one window (0, 3, 5), one long episode after them; a stream
# that starts mid-episode (seg 0 before its first start) with two starts in a row (9, 10); a
# stream with no start at all.
STARTS = [(0, 3, 5, 13), (2, 9, 10), ()]


def make_model(across, fused):
    impl = "pallas" if fused else None
    return TransformerActorCritic(num_actions=A, obs_ndim=1, d_model=64, n_layers=2, n_heads=2,
                                  context_len=C, context_across_episodes=across,
                                  attn_implementation=impl, mlp_implementation=impl)


def make_inputs(seed=0):
    return make_stream(STARTS, L, A, OBS, seed)


def make_valid(seed=1):
    """~25% padding tokens, scattered at random."""
    valid = np.random.default_rng(seed).random((B, L)) > 0.25
    valid[:, -1] = True  # so the returned cache surely holds valid entries to compare
    return jnp.asarray(valid)


def loss_fn(model, params, xs, valid):
    """A scalar that mixes every logit and value with random weights, counted only at valid
    positions, plus the returned cache's valid keys and values."""
    logits, values, cache = model.apply(params, None, *xs, valid=valid)
    rng = np.random.default_rng(2)
    w = jnp.ones((B, L)) if valid is None else valid.astype(jnp.float32)
    loss = jnp.sum(w[..., None] * logits * rng.normal(size=logits.shape).astype(np.float32))
    loss += jnp.sum(w * values * rng.normal(size=values.shape).astype(np.float32))
    m = cache.valid[:, :, None, None]
    for x in cache.k + cache.v:
        loss += 0.1 * jnp.sum(jnp.where(m, x, 0) * rng.normal(size=x.shape).astype(np.float32))
    return loss, (logits, values, cache)


value_and_grad = jax.jit(lambda model, params, xs, valid: jax.value_and_grad(
    loss_fn, argnums=1, has_aux=True)(model, params, xs, valid), static_argnums=0)


@pytest.mark.slow
def test_fused_model_init_matches_xla_model():
    """Params created through the fused model: same tree, shapes, dtypes and (same key) values
    as the XLA model's, so either model can load the other's checkpoints."""
    xs = make_inputs()
    ref = jax.jit(make_model(False, fused=False).init)(jax.random.key(3), None, *xs)
    got = jax.jit(make_model(False, fused=True).init)(jax.random.key(3), None, *xs)
    assert jax.tree.structure(got) == jax.tree.structure(ref)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        assert a.shape == b.shape and a.dtype == b.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
@pytest.mark.parametrize("with_valid", [False, True], ids=["valid=None", "valid=random"])
@pytest.mark.parametrize("across", [False, True], ids=["per-episode", "across-episodes"])
def test_fused_model_equals_xla_model(across, with_valid):
    xs = make_inputs()
    valid = make_valid() if with_valid else None
    ref_model, fused_model = make_model(across, fused=False), make_model(across, fused=True)
    params = random_transformer_params(ref_model, OBS)

    (ref_loss, (ref_logits, ref_values, ref_cache)), ref_grads = value_and_grad(ref_model, params, xs, valid)
    (loss, (logits, values, cache)), grads = value_and_grad(fused_model, params, xs, valid)

    keep = np.ones((B, L), bool) if valid is None else np.asarray(valid)
    assert_near(np.asarray(logits)[keep], np.asarray(ref_logits)[keep], what="logits")
    assert_near(np.asarray(values)[keep], np.asarray(ref_values)[keep], what="values")
    assert_near(loss, ref_loss, what="loss")

    # The returned cache: same validity and position; keys/values agree where valid (stale
    # slots may hold anything).
    np.testing.assert_array_equal(np.asarray(cache.valid), np.asarray(ref_cache.valid))
    np.testing.assert_array_equal(np.asarray(cache.pos), np.asarray(ref_cache.pos))
    assert np.asarray(cache.valid).any()
    m = np.asarray(ref_cache.valid)[:, :, None, None]
    for got, want in zip(cache.k + cache.v, ref_cache.k + ref_cache.v):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert_near(np.where(m, got, 0), np.where(m, want, 0), what="cache")

    assert_trees_near(grads, ref_grads, rtol=1e-5)
    # Not vacuous: every parameter gets a gradient.
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(ref_grads))


# ----------------------------------------------------------------------------------------------
# 2. The attention kernel alone vs a direct jnp reference.

H, DH = 2, 32


def attention_reference(qkv, seg, valid, window):
    """RoPE + explicit masked softmax: query i sees key j iff j <= i, i - j < window, key j is
    valid and in i's segment; and always itself."""
    b, n = qkv.shape[:2]
    pos = jnp.broadcast_to(jnp.arange(n), (b, n))
    q, k, v = rope(qkv[:, :, 0], pos), rope(qkv[:, :, 1], pos), qkv[:, :, 2]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") / np.sqrt(qkv.shape[-1])
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = jnp.broadcast_to((j <= i) & (i - j < window), (b, n, n))
    if seg is not None:
        allowed &= seg[:, :, None] == seg[:, None, :]
    if valid is not None:
        allowed &= valid[:, None, :]
    allowed |= np.eye(n, dtype=bool)
    p = jax.nn.softmax(jnp.where(allowed[:, None], s, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v, precision="highest")


def attention_params(d, seed=0):
    """LayerNorm scale and bias [d], QKV kernel [d, 3d] and bias [3d], float32."""
    rng = np.random.default_rng(seed)
    f32 = lambda *s, c=0.0, sd=1.0: jnp.asarray(c + sd * rng.normal(size=s), jnp.float32)
    return f32(d, c=1.0, sd=0.2), f32(d, sd=0.2), f32(d, 3 * d, sd=1 / np.sqrt(d)), f32(3 * d, sd=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("n, window, masks", [
    (40, 7, "seg+valid"),   # not a power of 2: blocks of 32 + 16 rows, 8 rows out of range
    (40, 100, "valid"),     # window longer than the sequence: causal only
    (16, 5, "seg"),         # the smallest block
    (16, 16, "none"),
    (80, 80, "none"),       # the Algorithm Distillation window: blocks of 64 + 16 rows
    (100, 30, "seg"),       # 64 + 32 + 16 rows; the window drops the farthest block pair
])
def test_attention_kernel(n, window, masks):
    d = H * DH
    rng = np.random.default_rng(n + window)
    x = jnp.asarray(rng.normal(size=(2, n, d)), jnp.float32)
    params = attention_params(d, seed=n)
    seg = valid = None
    if "seg" in masks:  # episode index, with several boundaries inside a window
        seg = jnp.asarray(np.cumsum(rng.random((2, n)) < 0.2, axis=1), jnp.int32)
    if "valid" in masks:
        valid = jnp.asarray(rng.random((2, n)) > 0.3)
    cos, sin = rope_tables(jnp.arange(n), DH, jnp.float32)

    fused = lambda x, *p: fused_attention.attend(x, *p, cos, sin, seg, valid, window, H, interpret=True)
    ref = lambda x, *p: (attention_reference(fused_attention.reference(x, *p, H), seg, valid, window), x)
    # (jitted: the interpreter's many small ops run as one program, not one dispatch each)
    (out, x_out), vjp = jax.vjp(jax.jit(fused), x, *params)
    (ref_out, _), ref_vjp = jax.vjp(jax.jit(ref), x, *params)
    assert out.shape == (2, n, H, DH) and out.dtype == jnp.float32
    assert_near(out, ref_out, what="o")
    assert (x_out == x).all()  # the residual stream passes through

    # Cotangents for o and for the x passed through (the residual stream's gradient).
    cot = (jnp.asarray(rng.normal(size=out.shape), jnp.float32), jnp.asarray(rng.normal(size=x.shape), jnp.float32))
    for name, got, want in zip(("dx", "d ln_scale", "d ln_bias", "dw", "db"), vjp(cot), ref_vjp(cot)):
        assert got.shape == want.shape
        assert_near(got, want, what=name)


@pytest.mark.slow
def test_attention_kernel_under_jit_and_grad():
    """Through jit and jax.grad (not only jax.vjp), with non-default warps and block size."""
    n, window, d = 24, 9, H * DH
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=(3, n, d)), jnp.float32)
    params = attention_params(d, seed=3)
    seg = jnp.asarray(np.cumsum(rng.random((3, n)) < 0.15, axis=1), jnp.int32)
    cos, sin = rope_tables(jnp.arange(n), DH, jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, n, H, DH)), jnp.float32)
    loss = lambda x, p: jnp.sum(w * fused_attention.attend(x, *p, cos, sin, seg, None, window, H, (2, 8, 2), True, 16)[0])
    ref_loss = lambda x, p: jnp.sum(w * attention_reference(fused_attention.reference(x, *p, H), seg, None, window))
    assert_trees_near(jax.jit(jax.grad(loss, argnums=(0, 1)))(x, params),
                      jax.jit(jax.grad(ref_loss, argnums=(0, 1)))(x, params))


def test_attention_blocks():
    """How a sequence is cut into power-of-2 blocks (the kernels' tiling)."""
    assert fused_attention._blocks(80) == ((0, 64), (64, 16))
    assert fused_attention._blocks(20) == ((0, 32),)          # rounded up: pads 12 rows
    assert fused_attention._blocks(100) == ((0, 64), (64, 32), (96, 16))
    assert fused_attention._blocks(128) == ((0, 64), (64, 64))
    assert fused_attention._blocks(128, max_block=128) == ((0, 128),)
    # Key blocks entirely `window` or more steps behind their query block are skipped.
    assert fused_attention._pairs(fused_attention._blocks(100), 30) == ((0, 0), (1, 0), (1, 1), (2, 1), (2, 2))


# ----------------------------------------------------------------------------------------------
# 3. The second-half kernel alone vs `fused_mlp.reference` (and that vs the flax modules).


def mlp_params(d, seed=0, hidden=None):
    """wo, bo, ln_scale, ln_bias, w1, b1, w2, b2."""
    hidden = 4 * d if hidden is None else hidden
    rng = np.random.default_rng(seed)
    f32 = lambda *s, c=0.0, sd=1.0: jnp.asarray(c + sd * rng.normal(size=s), jnp.float32)
    return (f32(d, d, sd=1 / np.sqrt(d)), f32(d, sd=0.2), f32(d, c=1.0, sd=0.2), f32(d, sd=0.2),
            f32(d, hidden, sd=1 / np.sqrt(d)), f32(hidden, sd=0.5), f32(hidden, d, sd=1 / np.sqrt(hidden)),
            f32(d, sd=0.2))


GRAD_NAMES = ("dx", "d attn", "dwo", "dbo", "d ln_scale", "d ln_bias", "dw1", "db1", "dw2", "db2")


def mlp_inputs(shape, dtype=jnp.float32, seed=1):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=shape) * 2 + 0.5, dtype)
    attn = jnp.asarray(rng.normal(size=shape), dtype)
    dy = jnp.asarray(rng.normal(size=shape), dtype)
    return x, attn, dy


@pytest.mark.slow
@pytest.mark.parametrize("shape, kwargs", [
    # N = 200 rows: the last of 4 row blocks is partly out of range; 2 hidden chunks.
    ((200, 32), {"block_rows": 64}),
    # Leading dims; the weight-gradient kernel with 13 row blocks in 3 groups of 5 (the last
    # group runs past the end of the rows) and 4 hidden chunks; the rows kernel reading dh in
    # 4 chunks of its own width.
    ((2, 50, 64), {"block_rows": 32, "weights_block_rows": 16, "row_groups": 3, "rows_block_hidden": 64}),
])
def test_mlp_kernel(shape, kwargs):
    x, attn, dy = mlp_inputs(shape)
    params = mlp_params(shape[-1])
    y, vjp = jax.vjp(jax.jit(lambda *a: fused_mlp.finish_block(*a, interpret=True, **kwargs)), x, attn, *params)
    ref_y, ref_vjp = jax.vjp(jax.jit(fused_mlp.reference), x, attn, *params)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_near(y, ref_y, what="y")
    grads, ref_grads = vjp(dy), ref_vjp(dy)
    for g, r, name in zip(grads, ref_grads, GRAD_NAMES):
        assert g.shape == r.shape and g.dtype == jnp.float32, name
        assert_near(g, r, what=name)


class _FlaxFinish(nn.Module):
    """The second half of transformer.Block, as flax computes it."""
    hidden: int
    dtype: object

    @nn.compact
    def __call__(self, x, attn):
        dense = lambda n: nn.Dense(n, dtype=self.dtype, param_dtype=jnp.float32)
        x = x + dense(x.shape[-1])(attn)
        h = nn.gelu(dense(self.hidden)(nn.LayerNorm(dtype=self.dtype, param_dtype=jnp.float32)(x)))
        return x + dense(x.shape[-1])(h)


def _flax_params(wo, bo, ln_scale, ln_bias, w1, b1, w2, b2):
    return {"params": {"Dense_0": {"kernel": wo, "bias": bo},
                       "LayerNorm_0": {"scale": ln_scale, "bias": ln_bias},
                       "Dense_1": {"kernel": w1, "bias": b1}, "Dense_2": {"kernel": w2, "bias": b2}}}


@pytest.mark.slow
def test_mlp_reference_is_the_flax_modules():
    x, attn, _ = mlp_inputs((2, 7, 32), seed=2)
    params = mlp_params(32, seed=3)
    flax_y = _FlaxFinish(128, jnp.float32).apply(_flax_params(*params), x, attn)
    assert_near(fused_mlp.reference(x, attn, *params), flax_y, what="reference vs flax")
    assert_near(fused_mlp.finish_block(x, attn, *params, block_rows=16, interpret=True), flax_y,
                 what="kernel vs flax")


@pytest.mark.slow
def test_mlp_kernel_bf16():
    """bf16 activations, fp32 params: y, dx and d attn bf16, parameter gradients fp32, all within
    bf16 rounding (relative 2e-2) of the fp32 computation on the same (bf16-valued) inputs."""
    x, attn, dy = mlp_inputs((100, 64), jnp.bfloat16, seed=4)
    params = mlp_params(64, seed=5)
    y, vjp = jax.vjp(jax.jit(lambda *a: fused_mlp.finish_block(*a, block_rows=32, interpret=True)), x, attn,
                     *params)
    assert y.dtype == jnp.bfloat16
    f32 = lambda a: a.astype(jnp.float32)
    ref_y, ref_vjp = jax.vjp(fused_mlp.reference, f32(x), f32(attn), *params)
    # The branches y - x (the residual alone would make any branch look right).
    assert_near(f32(y) - f32(x), ref_y - f32(x), rtol=2e-2, what="y - x")
    grads, ref_grads = vjp(dy), ref_vjp(f32(dy))
    assert all(g.dtype == jnp.bfloat16 for g in grads[:2]) and all(g.dtype == jnp.float32 for g in grads[2:])
    assert_near(f32(grads[0]) - f32(dy), ref_grads[0] - f32(dy), rtol=2e-2, what="dx - dy")
    for g, r, name in zip(grads[1:], ref_grads[1:], GRAD_NAMES[1:]):
        assert_near(f32(g), r, rtol=2e-2, what=name)


def heads_inputs(shape, outputs, dtype, seed=6):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=shape) * 2 + 0.5, dtype)
    d = shape[-1]
    params = (jnp.asarray(1 + 0.1 * rng.normal(size=d), jnp.float32), jnp.asarray(0.1 * rng.normal(size=d), jnp.float32),
              jnp.asarray(rng.normal(size=(d, outputs)), jnp.float32), jnp.asarray(rng.normal(size=outputs), jnp.float32))
    dout = jnp.asarray(rng.normal(size=shape[:-1] + (outputs,)), jnp.float32)
    return x, params, dout


@pytest.mark.slow
@pytest.mark.parametrize("dtype, rtol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_heads_kernel(dtype, rtol):
    """LN -> float32 heads: 2 x 45 = 90 rows in blocks of 32 (the last partly out of range), 5
    outputs (computed 16 wide); out and every gradient against the flax-style reference. In
    bf16 the reference is the same function (the LayerNorm's output rounded to bf16 both ways);
    dx differs by the rounding of the cotangent, which flax's cast rounds to bf16 first."""
    x, params, dout = heads_inputs((2, 45, 32), 5, dtype)
    out, vjp = jax.vjp(jax.jit(lambda *a: fused_heads.heads(*a, block_rows=32, interpret=True)), x, *params)
    ref_out, ref_vjp = jax.vjp(fused_heads.reference, x, *params)
    assert out.shape == (2, 45, 5) and out.dtype == jnp.float32
    assert_near(out, ref_out, rtol=1e-5, what="out")
    grads, ref_grads = vjp(dout), ref_vjp(dout)
    assert grads[0].dtype == dtype and all(g.dtype == jnp.float32 for g in grads[1:])
    for g, r, name in zip(grads, ref_grads, ("x", "ln_scale", "ln_bias", "w", "b")):
        assert_near(g.astype(jnp.float32), r.astype(jnp.float32), rtol=rtol if name != "w" else 1e-5, what=name)


@pytest.mark.slow
def test_heads_reference_is_the_flax_modules():
    x, (ln_scale, ln_bias, w, b), _ = heads_inputs((3, 7, 32), 4, jnp.bfloat16)
    ln = nn.LayerNorm(dtype=jnp.bfloat16, param_dtype=jnp.float32)
    xn = ln.apply({"params": {"scale": ln_scale, "bias": ln_bias}}, x).astype(jnp.float32)
    flax_out = nn.Dense(4, dtype=jnp.float32).apply({"params": {"kernel": w, "bias": b}}, xn)
    assert_near(fused_heads.reference(x, ln_scale, ln_bias, w, b), flax_out, what="reference vs flax")


def test_heads_rejects_unsupported_shapes():
    x, params, _ = heads_inputs((10, 32), 3, jnp.float32)
    ln_scale, ln_bias, w, b = params
    with pytest.raises(ValueError, match="w \\[32, K\\]"):
        fused_heads.heads(x, ln_scale, ln_bias, w[:16], b, interpret=True)
    with pytest.raises(ValueError, match="d_model 48"):
        fused_heads.heads(jnp.zeros((10, 48)), *heads_inputs((10, 48), 3, jnp.float32)[1], interpret=True)
    with pytest.raises(ValueError, match="block_rows"):
        fused_heads.heads(x, *params, block_rows=24, interpret=True)
    # Over 127 actions a model with mlp_implementation="pallas" keeps XLA's heads.
    assert not fused_heads.supported(32, 129) and fused_heads.supported(32, 128)


# ----------------------------------------------------------------------------------------------
# 4. Unsupported shapes fail loudly.


@pytest.mark.slow
def test_attention_rejects_unsupported_shapes():
    def call(n, d, heads):
        x = jnp.zeros((1, n, d), jnp.float32)
        cos, sin = rope_tables(jnp.arange(n), d // heads, jnp.float32)
        # Shapes only: the check runs while tracing, no kernel is executed.
        return jax.eval_shape(lambda x: fused_attention.attend(x, *attention_params(d), cos, sin, None, None, 8,
                                                               heads, interpret=True)[0], x)

    with pytest.raises(ValueError, match="length 129"):
        call(129, 64, 2)
    with pytest.raises(ValueError, match="head dim 16"):
        call(16, 32, 2)
    with pytest.raises(ValueError, match="head dim 48"):
        call(16, 96, 2)
    with pytest.raises(ValueError, match="d_model 256"):
        call(16, 256, 2)
    assert call(128, 64, 2).shape == (1, 128, 2, 32)  # the limits themselves are accepted
    assert call(16, 128, 1).shape == (1, 16, 1, 128)
    with pytest.raises(ValueError, match="w \\[64, 192\\]"):
        x = jnp.zeros((1, 16, 64), jnp.float32)
        ln_scale, ln_bias, w, b = attention_params(64)
        cos, sin = rope_tables(jnp.arange(16), 32, jnp.float32)
        fused_attention.attend(x, ln_scale, ln_bias, w[:, :96], b, cos, sin, None, None, 8, 2, interpret=True)


def test_fused_model_rejects_head_dim_16():
    model = TransformerActorCritic(num_actions=A, obs_ndim=1, d_model=32, n_layers=1, n_heads=2,
                                   context_len=4, attn_implementation="pallas")
    xs = jax.tree.map(lambda x: x[:, :8], make_inputs())
    with pytest.raises(ValueError, match="head dim 16"):
        jax.eval_shape(model.init, jax.random.key(0), None, *xs)


def test_fused_model_rejects_unsupported_mlp_width():
    with pytest.raises(ValueError, match="d_model"):
        model = TransformerActorCritic(num_actions=A, obs_ndim=1, d_model=96, n_layers=1, n_heads=3,
                                       context_len=4, mlp_implementation="pallas")
        jax.eval_shape(model.init, jax.random.key(0), None, *jax.tree.map(lambda x: x[:, :4], make_inputs()))


def test_mlp_rejects_unsupported_shapes():
    x = jnp.zeros((10, 48), jnp.float32)
    with pytest.raises(ValueError, match="d_model must be a power of 2"):
        fused_mlp.finish_block(x, x, *mlp_params(48), interpret=True)
    x = jnp.zeros((10, 32), jnp.float32)
    with pytest.raises(ValueError, match="hidden must be a power of 2"):
        fused_mlp.finish_block(x, x, *mlp_params(32, hidden=96), interpret=True)
    with pytest.raises(ValueError, match="block_rows must be a power of 2"):
        fused_mlp.finish_block(x, x, *mlp_params(32), block_rows=48, interpret=True)
    with pytest.raises(ValueError, match="rows_block_hidden must be a power of 2"):
        fused_mlp.finish_block(x, x, *mlp_params(32), rows_block_hidden=96, interpret=True)
    wo, bo, ln_scale, ln_bias, w1, b1, w2, b2 = mlp_params(32)
    with pytest.raises(ValueError, match="w1 has shape"):
        fused_mlp.finish_block(x, x, wo, bo, ln_scale, ln_bias, w1[:16], b1, w2, b2, interpret=True)
    with pytest.raises(ValueError, match="wo has shape"):
        fused_mlp.finish_block(x, x, wo[:16], bo, ln_scale, ln_bias, w1, b1, w2, b2, interpret=True)
    with pytest.raises(ValueError, match="attn has shape"):
        fused_mlp.finish_block(x, x[:5], *mlp_params(32), interpret=True)


# ----------------------------------------------------------------------------------------------
# 5. The other paths of a model built with the kernels: acting (`step`, whose MLP half-blocks run
# the fused MLP on one token per environment) and the learner with a prefix cache. The module
# docstring: "with a prefix cache and in `step` attention stays with XLA".


@pytest.mark.slow
def test_fused_model_step_and_cache_paths_equal_xla():
    xs = make_inputs()
    split = 8

    def run(model, params):
        def body(cache, x):
            logits, value, cache = model.apply(params, cache, *x, method=model.step)
            return cache, (logits, value)

        steps = jax.tree.map(lambda x: x[:, :split].swapaxes(0, 1), xs)
        cache, (logits, values) = jax.lax.scan(body, model.init_cache(B), steps)
        more = model.apply(params, cache, *jax.tree.map(lambda x: x[:, split:], xs))
        return logits.swapaxes(0, 1), values.swapaxes(0, 1), more

    ref_model, fused_model = make_model(False, fused=False), make_model(False, fused=True)
    params = random_transformer_params(ref_model, OBS)
    ref = jax.jit(run, static_argnums=0)(ref_model, params)
    got = jax.jit(run, static_argnums=0)(fused_model, params)
    assert_near(got[0], ref[0], what="step logits")
    assert_near(got[1], ref[1], what="step values")
    assert_near(got[2][0], ref[2][0], what="logits after a prefix cache")
    assert_near(got[2][1], ref[2][1], what="values after a prefix cache")
