"""The transformer policy in PPO, and mixed precision (the gradient step itself: test_learner.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import make_trainer

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
