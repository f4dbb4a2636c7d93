"""algos/learner.py: the shared gradient step (gradient accumulation, fp16 loss scaling)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_mgpu.algos import learner
from jaxrl_mgpu.parallel import AXIS


def _quadratic_loss(params, batch):
    pred = jnp.tanh(batch["x"] @ params["w"]) @ params["v"]
    loss = jnp.mean((pred - batch["y"]) ** 2)
    return loss, {"loss": loss}


def _run_step(devices, batch, grad_accum, precision="fp32", scale=None):
    tx = optax.adam(1e-2)
    params = {"w": jnp.ones((3, 4)) * 0.1, "v": jnp.arange(4.0)}
    loss_scale = scale if scale is not None else learner.LossScale.init(precision)
    fn = jax.pmap(lambda b: learner.step(_quadratic_loss, tx, params, tx.init(params), loss_scale, b, grad_accum,
                                         precision), axis_name=AXIS, devices=jax.devices()[:devices])
    split = jax.tree.map(lambda x: x.reshape((devices, -1) + x.shape[1:]), batch)
    return jax.tree.map(lambda x: x[0], fn(split))


@pytest.mark.slow
def test_grad_accumulation_equals_one_big_batch():
    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    batch = {"x": jax.random.normal(key1, (32, 3)), "y": jax.random.normal(key2, (32,))}
    big = _run_step(1, batch, grad_accum=1)
    accumulated = _run_step(1, batch, grad_accum=4)
    spread = _run_step(4, batch, grad_accum=2)  # and over devices too
    for other in (accumulated, spread):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), big[0], other[0])
    assert not np.allclose(big[0]["w"], 0.1)


def test_fp16_overflow_skips_the_step_and_lowers_the_scale():
    batch = {"x": jnp.ones((8, 3)), "y": jnp.zeros((8,))}
    huge = learner.LossScale(jnp.float32(3e38), jnp.int32(0))  # loss x scale overflows
    params, _, scale, stats = _run_step(1, batch, 1, "fp16", huge)
    np.testing.assert_array_equal(params["w"], np.ones((3, 4), np.float32) * np.float32(0.1))
    assert float(stats["fp16/skipped"]) == 1.0 and float(scale.scale) == pytest.approx(1.5e38)
    params, _, scale, stats = _run_step(1, batch, 1, "fp16")
    assert float(stats["fp16/skipped"]) == 0.0 and not np.allclose(params["w"], 0.1)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_weight_decay_shrinks_every_parameter_by_lr_times_decay_where_the_gradient_is_zero(weight_decay):
    """--weight-decay is AdamW's decoupled decay (p <- p - lr (adam + wd p)); 0 is plain Adam, which
    a zero gradient leaves where it is."""
    from jaxrl_mgpu import config as config_lib
    cfg = config_lib.build(dict(algo="sac", env="Pendulum-v1", lr=1e-2, weight_decay=weight_decay,
                                anneal_lr=False))
    tx = learner.adam(cfg, 10)
    params = {"w": jnp.full((3,), 2.0), "b": jnp.array([-1.0])}
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    stepped = optax.apply_updates(params, updates)
    shrink = 1.0 - 1e-2 * weight_decay
    np.testing.assert_allclose(stepped["w"], 2.0 * shrink, rtol=1e-6)
    np.testing.assert_allclose(stepped["b"], -1.0 * shrink, rtol=1e-6)
