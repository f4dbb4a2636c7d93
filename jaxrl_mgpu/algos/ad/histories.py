"""AD's source learners (Algorithm Distillation, Laskin et al. 2022): tabular Q-learning over
the agent's (x, y) cell (plus, in DarkRoomHard, whether this episode's reward was already
collected), exploring with a UCB bonus (`ucb`) or epsilon-greedy (`q`). One learner per task
(goal cell) runs for a number of environment steps (`lax.scan`, entirely on device); the tasks
are `vmap`-ed on each device and spread over the local devices. Each task's whole history
(consecutive episodes, the learner improving as it goes) is what AD distils: written as a
dataset by `python -m jaxrl_mgpu.histories` (tools/histories.py), or into a run's store by
AD's collectors (algos/ad/asynchronous.py).

Task i draws its randomness from `fold_in(seed, i)`, so a history does not depend on how many
devices share the work. Tasks that do not fill the last device are padded with copies and the
copies dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import parallel
from jaxrl_mgpu.data import rlds
from jaxrl_mgpu.envs import EnvError, darkroom


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Tabular Q-learning hyperparameters (stored in the dataset's metadata)."""
    algo: str = "ucb"            # "ucb": bonus c * sqrt(log n(s) / n(s, a)); "q": epsilon-greedy
    lr: float = 0.5
    gamma: float = 0.9
    ucb_c: float = 1.0
    eps_start: float = 1.0       # "q": epsilon decays linearly to eps_end ...
    eps_end: float = 0.05
    eps_decay_fraction: float = 0.5  # ... over this fraction of the run


class Learner(NamedTuple):
    """One task's learner and environment, carried through the scan."""
    q: jax.Array        # [tables * cells, actions] action values
    count: jax.Array    # [tables * cells, actions] visits, for the UCB bonus
    env_state: Any
    obs: jax.Array      # [2] the (x, y) to act on
    rewarded: jax.Array # 1 once rewarded this episode (tracked only where the room pays once)
    step: jax.Array     # steps done


class Transition(NamedTuple):
    observation: jax.Array
    action: jax.Array
    reward: jax.Array
    done: jax.Array
    terminated: jax.Array


def choose(source: LearnerConfig, num_steps: int, learner: Learner, state: jax.Array, key: jax.Array) -> jax.Array:
    """The exploring action in table row `state`. Ties (e.g. all-zero values at the start) are
    broken at random, so early exploration has no built-in direction."""
    key_tie, key_eps, key_random = jax.random.split(key, 3)
    q, n = learner.q[state], learner.count[state]
    tie = 1e-6 * jax.random.uniform(key_tie, q.shape)
    if source.algo == "ucb":
        bonus = source.ucb_c * jnp.sqrt(jnp.log(n.sum() + 1.0) / jnp.maximum(n, 1.0))
        # Untried actions first. A large finite score, not inf: inf + tie noise is still inf, and
        # argmax would always pick the first untried action.
        return jnp.argmax(jnp.where(n == 0, 1e9, q + bonus) + tie)
    progress = learner.step / (source.eps_decay_fraction * num_steps)
    eps = source.eps_start + (source.eps_end - source.eps_start) * jnp.clip(progress, 0.0, 1.0)
    greedy = jnp.argmax(q + tie)
    return jnp.where(jax.random.uniform(key_eps) < eps,
                     jax.random.randint(key_random, (), 0, q.shape[0]), greedy)


def learn(env, source: LearnerConfig, num_steps: int, key: jax.Array, goal: jax.Array) -> Transition:
    """One task's whole learning history: `num_steps` Q-learning steps, as transitions [num_steps]."""
    params = env.params_for(goal)
    cells = env.size * env.size
    # In a room that pays only once an episode, the value of a cell depends on whether the reward
    # was already collected; the learner knows that from its own rewards, so it keeps a second
    # table for "rewarded this episode" to stay Markov.
    tables = 2 if env.reward_once else 1

    def state_of(obs, rewarded):
        return (obs[0] * env.size + obs[1]).astype(jnp.int32) + cells * rewarded

    def step(learner: Learner, key):
        key_act, key_env = jax.random.split(key)
        state = state_of(learner.obs, learner.rewarded)
        action = choose(source, num_steps, learner, state, key_act)
        obs, env_state, reward, terminated, truncated, info = env.step(key_env, learner.env_state, action, params)
        rewarded = jnp.int32(env.reward_once) * jnp.maximum(learner.rewarded, (reward > 0).astype(jnp.int32))
        # Bootstrap through truncation, from the observation before the auto-reset.
        next_state = state_of(info["final_observation"], rewarded)
        target = reward + source.gamma * (1.0 - terminated) * learner.q[next_state].max()
        q = learner.q.at[state, action].add(source.lr * (target - learner.q[state, action]))
        done = jnp.logical_or(terminated, truncated)
        seen = Transition(learner.obs, action, reward, done, terminated)
        return Learner(q, learner.count.at[state, action].add(1.0), env_state, obs,
                       jnp.where(done, 0, rewarded), learner.step + 1), seen

    key_reset, key_steps = jax.random.split(key)
    obs, env_state = env.reset(key_reset, params)
    table = jnp.zeros((tables * cells, env.num_actions))
    start = Learner(table, table, env_state, obs, jnp.int32(0), jnp.int32(0))
    _, history = jax.lax.scan(step, start, jax.random.split(key_steps, num_steps))
    return history


def run(env_name: str, goals: np.ndarray, num_steps: int, seed: int, source: LearnerConfig,
        par: parallel.Parallel) -> rlds.Histories:
    """The learning histories of one learner per goal ([tasks, 2]), over all local devices."""
    env, _ = darkroom_env(env_name)
    num_tasks, devices = len(goals), par.num_local_devices
    per_device = -(-num_tasks // devices)
    # Pad with copies of the last goal so every device gets as many tasks; copies are dropped.
    index = np.minimum(np.arange(per_device * devices), num_tasks - 1)
    keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(seed), jnp.asarray(index))
    by_device = lambda x: np.asarray(x).reshape((devices, per_device) + np.shape(x)[1:])  # noqa: E731

    def per_device_fn(keys, goals):  # this device's tasks, one learner each
        return jax.vmap(lambda k, g: learn(env, source, num_steps, k, g))(keys, goals)

    out = par.map(per_device_fn)(par.shard(by_device(keys)), par.shard(by_device(goals[index])))
    out = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[:num_tasks], par.local(out))
    return rlds.Histories(observation=out.observation, action=out.action.astype(np.int32),
                          reward=out.reward.astype(np.float32), done=out.done, terminated=out.terminated,
                          task=np.asarray(goals, np.int32))


def darkroom_env(env_name: str):
    if env_name not in darkroom.ROOMS:
        raise EnvError(f"--env {env_name!r} has no source learner; choose from: {', '.join(darkroom.ROOMS)}")
    env = darkroom.ROOMS[env_name]()
    return env, env.default_params


def source_metadata(env_name: str, source: LearnerConfig, tasks: int, steps: int, seed: int, split: str) -> dict:
    """What a dataset of learning histories records about its source: env, algorithm and its
    config, size, and the seed and split of the goals (in-context evaluation holds out the
    other split)."""
    env, _ = darkroom_env(env_name)
    return {"env": env_name, "algo": f"tabular-q-{source.algo}", "algo_config": dataclasses.asdict(source),
            "tasks": tasks, "steps": steps, "seed": seed, "split": split, "episode_len": env.episode_len}


def episode_returns(h: rlds.Histories, episode_len: int) -> np.ndarray:
    """[tasks, episodes] returns of fixed-length episodes."""
    return h.reward.reshape(h.num_tasks, -1, episode_len).sum(-1)
