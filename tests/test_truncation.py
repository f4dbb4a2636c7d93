"""A time limit is not a terminal state (issue 50, point 3): on an environment whose episodes
only ever end by time limit, PPO's value targets (GAE) and DQN's n-step targets bootstrap from
the value of the observation the episode was cut at, checked exactly against a hand
computation with a fixed value function that tells that observation from the reset one."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs, parallel
from jaxrl_mgpu.algos.dqn import dqn
from jaxrl_mgpu.algos.ppo import ppo
from jaxrl_mgpu.algos.replay import replay_gather

from helpers import resolved

T = 5  # the time limit: every episode is T steps, each with reward 1


@struct.dataclass
class TimeState(environment.EnvState):
    pass


class ConstantReward(environment.Environment):
    """Reward 1 every step; never terminates; truncated after `max_steps_in_episode` steps.
    The observation is [time / T]: the observation an episode is cut at (1.0) differs from the
    one the next episode starts with (0.0)."""

    @property
    def default_params(self) -> environment.EnvParams:
        return environment.EnvParams(max_steps_in_episode=T)

    def observe_time(self, state: TimeState) -> jax.Array:
        return jnp.array([state.time / T], jnp.float32)

    def step_env(self, key, state, action, params):
        state = TimeState(time=state.time + 1)
        return self.observe_time(state), state, jnp.float32(1.0), jnp.bool_(False), {}

    def reset_env(self, key, params):
        state = TimeState(time=0)
        return self.observe_time(state), state

    @property
    def num_actions(self) -> int:
        return 2

    def action_space(self, params):
        return spaces.Discrete(2)

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (1,), jnp.float32)


NAME = "ConstantReward-test"
envs.register(NAME, lambda: (ConstantReward(), ConstantReward().default_params), {})

GAMMA, LAMBDA = 0.9, 0.8
NUM_ENVS, NUM_STEPS = 4, 12  # 12 steps: time limits at steps 4 and 9, and a rollout that ends mid-episode
W, C, A = 2.0, 3.0, 4.0      # the fixed value function: V(o) = A + C tanh(tanh(W o))


def value(o):
    return A + C * np.tanh(np.tanh(W * np.asarray(o, np.float64)))


def fixed_head(params, out_bias, out_scale):
    """A 2-layer tanh MLP head (Dense_0, Dense_1, Dense_2) set to out_bias + out_scale * tanh(tanh(W o))
    for a one-dimensional observation o, every other weight 0."""
    kernel0 = np.zeros(params["Dense_0"]["kernel"].shape, np.float32)
    kernel0[0, 0] = W
    kernel1 = np.zeros(params["Dense_1"]["kernel"].shape, np.float32)
    kernel1[0, 0] = 1.0
    kernel2 = np.zeros(params["Dense_2"]["kernel"].shape, np.float32)
    kernel2[0, :] = out_scale
    zeros = lambda name: np.zeros(params[name]["bias"].shape, np.float32)  # noqa: E731
    return {"Dense_0": {"kernel": kernel0, "bias": zeros("Dense_0")},
            "Dense_1": {"kernel": kernel1, "bias": zeros("Dense_1")},
            "Dense_2": {"kernel": kernel2, "bias": np.asarray(out_bias, np.float32)}}


def small_config(**overrides):
    return config_lib.validate(config_lib.build(dict(env=NAME, num_envs=NUM_ENVS,
                                                   num_steps=NUM_STEPS, gamma=GAMMA, hidden_size=8,
                                                   activation="tanh", **overrides)))


@pytest.mark.slow
def test_ppo_value_targets_bootstrap_from_the_observation_a_time_limit_cut_at():
    cfg = small_config(gae_lambda=LAMBDA, total_timesteps=NUM_ENVS * NUM_STEPS)
    env, env_params = envs.make(NAME)
    algo = ppo.make(cfg, env, env_params, ppo.check(resolved(cfg), 1))
    par = parallel.setup("pmap", 1)
    params = jax.tree.map(np.asarray, algo.init_params(jax.random.PRNGKey(0)))
    params["params"]["critic"] = fixed_head(params["params"]["critic"], [A], [C])

    def targets(params, key):
        state = algo.init(key)
        _, _, traj, last_value, _ = algo.rollout(params, state.envs, state.memory, state.key)
        advantages, targets, _, _ = ppo.learning_targets(cfg, traj, last_value, (), ())
        return traj, advantages, targets

    traj, advantages, targets = par.first(par.map(targets)(par.replicate(params),
                                                           par.replicate(jax.random.PRNGKey(0))))

    # By hand: step t acts on time t % T; step t ends its episode by time limit where t % T == T - 1,
    # and the value there is of the observation the episode was cut at (T / T), not of the reset one.
    time = np.arange(NUM_STEPS) % T
    truncated = time == T - 1
    next_obs = np.where(truncated, 1.0, ((np.arange(NUM_STEPS) + 1) % T) / T)
    delta = 1.0 + GAMMA * value(next_obs) - value(time / T)
    expected = np.zeros(NUM_STEPS)
    later = 0.0
    for t in reversed(range(NUM_STEPS)):
        later = delta[t] + (0.0 if truncated[t] else GAMMA * LAMBDA * later)
        expected[t] = later
    expected_targets = expected + value(time / T)

    for e in range(NUM_ENVS):
        np.testing.assert_array_equal(np.asarray(traj.reward)[:, e], 1.0)
        np.testing.assert_array_equal(np.asarray(traj.terminated)[:, e], 0.0)
        np.testing.assert_array_equal(np.asarray(traj.truncated)[:, e], truncated.astype(np.float32))
        np.testing.assert_allclose(np.asarray(traj.value)[:, e], value(time / T), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(traj.bootstrap)[:, e], np.where(truncated, value(1.0), 0.0), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(advantages)[:, e], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(targets)[:, e], expected_targets, rtol=1e-6)
    # The target of a step a time limit ends is r + gamma V(final observation), never r alone.
    np.testing.assert_allclose(np.asarray(targets)[truncated], 1.0 + GAMMA * value(1.0), rtol=1e-6)
    assert value(1.0) != value(0.0)  # so bootstrapping from the reset observation would fail the line above
    assert (np.asarray(targets) > 1.0 + GAMMA * A - 1e-4).all()


@pytest.mark.slow
def test_dqn_n_step_targets_bootstrap_from_the_observation_a_time_limit_cut_at():
    n_step = 3
    cfg = small_config(algo="dqn", n_step=n_step, buffer_size=NUM_ENVS * NUM_STEPS, replay_batch_size=4,
                       learning_starts=0, total_timesteps=NUM_ENVS * NUM_STEPS)
    env, env_params = envs.make(NAME)
    algo = dqn.make(cfg, env, env_params, dqn.check(resolved(cfg), 1))
    par = parallel.setup("pmap", 1)
    params = jax.tree.map(np.asarray, algo.init_params(jax.random.PRNGKey(0)))
    # Q(o, 0) = A + C g(o) > Q(o, 1) = 2 + g(o): the greedy action is 0, valued A + C g(o).
    params["params"]["MLP_0"] = fixed_head(params["params"]["MLP_0"], [A, 2.0], [C, 1.0])
    starts = np.arange(NUM_STEPS - n_step + 1)  # every window the rollout completes

    def targets(params, key):
        state = algo.init(key)
        _, _, replay, _, _, _ = algo.rollout(params, state.envs, state.memory, state.replay, state.key, jnp.int32(0))
        batch = replay_gather(replay, jnp.zeros(len(starts), jnp.int32), jnp.asarray(starts, jnp.int32),
                              n_step, GAMMA)

        def one(i):  # the learner's own target of transition i (its loss's target_mean over a batch of one)
            single = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i, 1), batch)
            return algo.learn(params, params, state.opt_state, state.loss_scale, single)[3]["loss/target_mean"]

        return batch, jax.lax.map(one, jnp.arange(len(starts)))

    batch, learner_targets = par.first(par.map(targets)(par.replicate(params), par.replicate(jax.random.PRNGKey(0))))

    for i, t in enumerate(starts):
        # Steps t..t+k, where step t+k is the first that reaches the time limit, or t + n - 1.
        k = next((j for j in range(n_step) if (t + j) % T == T - 1), n_step - 1)
        cut = (t + k) % T == T - 1
        boot_obs = 1.0 if cut else ((t + k + 1) % T) / T
        reward = sum(GAMMA ** j for j in range(k + 1))
        np.testing.assert_allclose(float(batch.reward[i]), reward, rtol=1e-6)
        np.testing.assert_allclose(float(batch.discount[i]), GAMMA ** (k + 1), rtol=1e-6)  # never 0: no terminal
        np.testing.assert_allclose(float(batch.next_obs[i, 0]), boot_obs, rtol=1e-6)
        np.testing.assert_allclose(float(learner_targets[i]), reward + GAMMA ** (k + 1) * value(boot_obs), rtol=1e-6)
    assert any((t + j) % T == T - 1 for t in starts for j in range(n_step))  # some windows do reach a time limit
