"""Transformer policy in PPO, mixed precision, gradient accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import make_trainer
from jaxrl_mgpu.algos import learner
from jaxrl_mgpu.parallel import AXIS

TRANSFORMER = dict(policy="transformer", d_model=32, n_layers=2, n_heads=4, context_len=6, num_envs=8,
                   num_steps=40, num_minibatches=2, total_timesteps=8 * 40 * 4)


@pytest.mark.slow
@pytest.mark.parametrize("across", [False, True])
def test_learner_recomputes_what_the_actor_saw(across):
    """Log-probs and values recorded while acting equal the learner's recomputation over the
    same steps, across episode boundaries and past the context window."""
    trainer = make_trainer(2, context_across_episodes=across, **TRANSFORMER)
    algo, par = trainer.algorithm.parts, trainer.par
    state = trainer.init_state()
    # Random-ish params: the PPO init makes outputs nearly independent of the inputs.
    state = state._replace(params=jax.tree.map(
        lambda p: p + 0.2 * jax.random.normal(jax.random.PRNGKey(3), p.shape), state.params))

    def check(s):
        # a first rollout so the second starts mid-stream with a non-empty cache
        _, memory, _, _, _ = algo.rollout(s.params, s.envs, s.memory, s.key)
        envs, _, traj, _, _ = algo.rollout(s.params, s.envs, memory, jax.random.fold_in(s.key, 1))
        inputs = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj.inputs)
        logits, values = algo.policy.evaluate(s.params, memory, inputs)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), traj.action.T[..., None], -1)[..., 0]
        return (jnp.abs(log_prob - traj.log_prob.T).max(), jnp.abs(values - traj.value.T).max(),
                traj.terminated.sum() + traj.truncated.sum())

    err_logp, err_value, episode_ends = par.first(par.map(check)(state))
    assert episode_ends >= 2
    assert err_logp < 1e-5 and err_value < 1e-5, (err_logp, err_value)


@pytest.mark.slow
def test_transformer_ppo_keeps_devices_in_sync():
    trainer = make_trainer(8, **{**TRANSFORMER, "num_envs": 16})
    state = trainer.init_state()
    state, chunk = trainer.chunk_fn(2, state)(state)
    per_device = trainer.par.local(state.params)
    for leaf in jax.tree.leaves(per_device):
        np.testing.assert_array_equal(leaf[0], leaf[-1])
    assert np.isfinite(trainer.par.first(chunk.losses["loss/total"]))


@pytest.mark.slow
def test_bf16_training_still_learns_cartpole():
    trainer = make_trainer(1, precision="bf16", total_timesteps=300_000)
    state = trainer.init_state()
    params_dtypes = {x.dtype for x in jax.tree.leaves(state.params)}
    assert params_dtypes == {jnp.dtype("float32")}, "params stay fp32"
    returns = []
    for _ in range(trainer.cfg.total_updates // 10):
        state, chunk = trainer.chunk_fn(10, state)(state)
        episodes = trainer.par.first(chunk.episodes)
        returns.append(float(episodes.return_sum / episodes.count))
    assert returns[0] < 60 and max(returns[-3:]) > 150, returns


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
