"""Double DQN for ONE device's slice of the work.

`make(cfg, env, env_params, num_devices)` returns the per-device functions the runner maps over
all devices:

    init(key)      -> DQNState      identical params everywhere (same key), own envs and replay
    update(state)  -> state, (losses, EpisodeStats)

One update:
  1. act: `num_steps` epsilon-greedy steps of this device's `num_envs / D` environments
     (`lax.scan`; Atari's games on the host in two halves, each simulating while the other's
     actions are inferred: vec.scan_halves); every transition goes into this device's replay;
  2. learn: once `learning_starts` env steps (global) have been collected,
     `G = num_steps x updates_per_step` gradient steps, each on `replay_batch_size / D`
     transitions sampled from this device's buffer. Gradients are `lax.pmean`-ed over `AXIS`,
     so every step follows the average gradient of the GLOBAL sampled batch and the params
     stay identical on every device.

So `--updates-per-step` counts gradient steps per vectorised env step (one step of all
`num_envs` environments), and the replay ratio in sampled transitions per collected
transition is `replay_batch_size x updates_per_step / num_envs`.

Replay (algos/replay.py): per-environment rings inside the training state, so they are
checkpointed with it and a resume is exact. Every update writes `num_steps` rows, so the write
position and fill level follow from the update counter; each device holds its own
environments' rings (`buffer_size / D` transitions). With `--replay-obs-dtype uint8`
observations are stored as bytes, a quarter of the memory, for observations of whole numbers
in 0..255 such as MinAtar's channel maps (which `check` verifies on random steps).

Acting (`epsilon_greedy`, `make_actor`, what the asynchronous collectors act with too):
exploration of environment i comes from its GLOBAL index (as in `vec.env_keys`), so acting
does not depend on the device count; replay sampling folds in the device index.

Targets (double DQN, n-step: replay.n_step_targets): the discounted rewards of steps t..t+k
(k < n, cut where an episode ends), bootstrapped unless the episode terminated with
gamma^(k+1) * Q_target(s', a*), a* = argmax Q_online(s'). The loss is the Huber loss (delta 1) of
Q_online(s_t, a_t) against that target. The gradient step is the shared `learner.step` (the
all-reduce, `--grad-accum` micro-batches, `--precision`), with `learner.adam`: Adam with
global-norm clipping (`--max-grad-norm`) and, with `--anneal-lr`, a linear decay to 0 over the
run's gradient steps.

Q-network: an MLP over the observation (a conv torso for images), or with `--policy transformer`
the actor head of the causal transformer (nets/transformer.py) over the recent history. The
transformer acts incrementally on a per-environment key/value cache kept in the state; the
learner recomputes Q(s_t) from the last `--context-len` steps of the replay up to s_t, and the
bootstrap value from the steps up to s' (R2D2-style stored sequences, without a stored cache:
the ring already holds each environment's steps in order, so a window is a gather).

Target network: with `--tau 1`, a hard copy of the online params every `--target-update-every`
gradient steps; with `--tau` < 1, Polyak averaging after every gradient step. Exploration:
epsilon decays linearly from `--eps-start` to `--eps-end` over `--eps-decay-steps` global env
steps. For evaluation, `policy` (the actor-critic interface of nets/actor_critic.py) gives
logits = log of the epsilon-greedy probabilities with `--eps-end`: sampling them is acting
epsilon-greedily, their argmax (`--greedy`) is acting greedily.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_mgpu.algos import learner
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Resolved
from jaxrl_mgpu.algos.replay import (Replay, SeqBatch, Transitions, first_learning_update, frame_replay_add,
                                     frame_replay_init, frame_replay_sample, grad_steps_per_update, gradient_steps,
                                     replay_add, replay_init, replay_sample, replay_split, target_update)
from jaxrl_mgpu.checkpoint import PER_ENV, REPLICATED
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.envs import traits, vec
from jaxrl_mgpu.nets import actor_critic, factory
from jaxrl_mgpu.nets.actor_critic import Memory, Policy
from jaxrl_mgpu.parallel import device_index, global_indices, zeros


class DQNState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    loss_scale: learner.LossScale
    envs: vec.EnvBatch
    memory: Any            # the Q-network's per-environment memory (a transformer's cache; mlp: ())
    replay: Replay
    key: jax.Array         # the same on every device; split once per update
    update: jax.Array      # updates done so far (x num_steps = vector steps written to the replay)
    grad_steps: jax.Array  # gradient steps done so far (drives the target-network updates)


# How each state field is laid out over devices (see checkpoint.py).
STATE_LAYOUT = {"params": REPLICATED, "target_params": REPLICATED, "opt_state": REPLICATED,
                "loss_scale": REPLICATED, "envs": PER_ENV, "memory": PER_ENV, "replay": PER_ENV, "key": REPLICATED,
                "update": REPLICATED, "grad_steps": REPLICATED}


class Algo(NamedTuple):
    init: Any         # key -> DQNState
    update: Any       # DQNState -> DQNState, (losses, EpisodeStats)
    rollout: Any      # params, EnvBatch, memory, Replay, key, vector steps so far -> EnvBatch, memory, Replay, actions, epsilons, Step
    init_params: Any  # key -> params (the same key gives the same params everywhere)
    policy: Any       # nets.actor_critic.Policy for evaluation: epsilon-greedy (eps-end) as logits
    learn: Any        # params, target_params, opt_state, loss_scale, batch -> params, opt_state, loss_scale, stats
    train_step: Any   # (params, target_params, opt_state, loss_scale, grad steps), batch -> that carry, stats:
                      # one gradient step and the target update, what --mode both and the async learner run


# -- layout and checks -------------------------------------------------------------------

def check(run: Resolved, num_devices: int) -> BatchSplit:
    """The batch layout over `num_devices`, or a ConfigError naming the option that breaks it."""
    cfg = run.cfg
    if not isinstance(actor_critic.distribution(run.env, run.env_params), actor_critic.Categorical):
        raise ConfigError(f"--algo dqn takes discrete actions (one Q-value each); --env {cfg.env} has continuous "
                          f"(Box) actions: use --algo sac or td3 (or ppo)")
    split = replay_split(cfg, num_devices)
    if factory.is_sequence_policy(cfg) and cfg.buffer_size // cfg.num_envs < cfg.context_len + cfg.n_step:
        raise ConfigError(f"--buffer-size {cfg.buffer_size} holds fewer than --context-len {cfg.context_len} + "
                          f"--n-step {cfg.n_step} steps of each of the {cfg.num_envs} environments")
    if cfg.replay_obs_dtype == "uint8" and (value := _first_non_byte_observation(run)) is not None:
        raise ConfigError(f"--replay-obs-dtype uint8 would change {cfg.env}'s observations (e.g. {value:g}): it "
                          f"stores whole numbers in 0..255 only; use float32")
    return split


# -- what the replay stores --------------------------------------------------------------

# What _first_non_byte_observation found, per (--env, --env-args): a run's checks ask more than once.
_NON_BYTE: dict[tuple, float | None] = {}


def _first_non_byte_observation(run: Resolved) -> float | None:
    """An observation of the run's environment (with its --env-args) that uint8 cannot hold (not
    a whole number in 0..255), from 16 environments over 64 random steps and their final
    observations; None if there is none."""
    known = (run.cfg.env, run.cfg.env_args)
    if known not in _NON_BYTE:
        _NON_BYTE[known] = _non_byte_observation(run.env, run.env_params)
    return _NON_BYTE[known]


def _non_byte_observation(env, env_params) -> float | None:
    ids, steps = jnp.arange(16), 64

    def observations(key):
        def body(batch, k):
            action_key, step_key = jax.random.split(k)
            action = jax.random.randint(action_key, ids.shape, 0, env.num_actions)
            batch, out = vec.step(env, env_params, batch, action, vec.env_keys(step_key, ids))
            return batch, (batch.obs, out.final_obs)
        first = vec.reset(env, env_params, key, ids)
        _, seen = jax.lax.scan(body, first, jax.random.split(key, steps))
        return jnp.concatenate([first.obs[None], *seen])

    obs = np.asarray(jax.jit(observations)(jax.random.PRNGKey(0)))
    bad = obs[(obs != np.round(obs)) | (obs < 0) | (obs > 255)]
    return float(bad[0]) if bad.size else None


def stores_frames(cfg, env, env_params) -> bool:
    """Whether the replay keeps each frame of stacked-frame observations once (FrameReplay): an
    environment that steps on the host in batches with [S, H, W] observations of bytes (Atari),
    whose observation after a step is the next one acted on, for an MLP's Q-network (the
    transformer reads the history itself)."""
    space = env.observation_space(env_params)
    return (traits(env).host_batched and len(space.shape) == 3 and jnp.dtype(space.dtype) == jnp.uint8
            and not factory.is_sequence_policy(cfg))


def stored_obs_dtype(cfg):
    """The dtype replays keep observations in (check() made sure uint8 loses nothing)."""
    return jnp.dtype(cfg.replay_obs_dtype)


# -- the algorithm -------------------------------------------------------------------------

def make_network(cfg, env, env_params):
    """Q-values from an MLP (conv torso for images), or from the actor head of the transformer
    of nets/transformer.py (`--policy transformer`), which sees the recent history."""
    obs_shape = env.observation_space(env_params).shape
    if factory.is_sequence_policy(cfg):
        return factory.transformer(cfg, env.num_actions, len(obs_shape))
    return factory.q_network(cfg, env.num_actions, len(obs_shape))


def epsilon(cfg, env_steps: jax.Array) -> jax.Array:
    """Linear from eps_start to eps_end over eps_decay_steps global env steps, then flat."""
    frac = jnp.clip(env_steps / max(cfg.eps_decay_steps, 1), 0.0, 1.0)
    return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)


def make_train_step(cfg, q_values, tx, sequence: bool = False):
    """Double DQN's gradient step on a batch, and with the target network's update after it:
    what --mode both runs on its replay and the asynchronous learner (algos/dqn/asynchronous.py) on its
    ring of the store's transitions. `q_values(params, x)`: Q-values [B, A] of a batch of inputs
    (observations, or with `sequence` the windows of a SeqBatch). Returns `learn(params,
    target_params, opt_state, loss_scale, batch) -> params, opt_state, loss_scale, stats` and
    `train_step((params, target_params, opt_state, loss_scale, grad_steps), batch) -> carry, stats`."""

    def loss_fn(params, target_params, batch):
        now, after = (batch.online, batch.target) if sequence else (batch.obs, batch.next_obs)
        both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), now, after)  # one forward pass for s and s'
        q, next_online = jnp.split(q_values(params, both), 2)
        q_taken = jnp.take_along_axis(q, batch.action[:, None], -1)[:, 0]
        best = jnp.argmax(next_online, axis=-1)  # double DQN: the online net picks the action ...
        next_q = jnp.take_along_axis(q_values(target_params, after), best[:, None], -1)[:, 0]
        target = jax.lax.stop_gradient(batch.reward + batch.discount * next_q)  # ... the target net values it
        td = optax.huber_loss(q_taken, target, delta=1.0).mean()
        return td, {"loss/td": td, "loss/q_mean": q_taken.mean(), "loss/target_mean": target.mean()}

    def learn(params, target_params, opt_state, loss_scale, batch: Transitions | SeqBatch):
        """One gradient step on this device's share of the global batch; the all-reduce in
        learner.step makes it the step of the whole global batch (every share has one size)."""
        return learner.step(lambda p, b: loss_fn(p, target_params, b), tx, params, opt_state, loss_scale, batch,
                            cfg.grad_accum, cfg.precision)

    def train_step(carry, batch: Transitions | SeqBatch):
        params, target_params, opt_state, loss_scale, step = carry
        params, opt_state, loss_scale, stats = learn(params, target_params, opt_state, loss_scale, batch)
        step = step + 1
        return (params, target_update(cfg, params, target_params, step), opt_state, loss_scale, step), stats

    return learn, train_step


def sampled_steps(train_step, sample, carry, xs):
    """`train_step` once per element of `xs`, each on a fresh batch `sample(x)` (this device's
    share of the global batch); returns the carry and the steps' mean stats."""
    carry, stats = jax.lax.scan(lambda c, x: train_step(c, sample(x)), carry, xs)
    return carry, jax.tree.map(jnp.mean, stats)


def epsilon_greedy(q: jax.Array, key: jax.Array, ids: jax.Array, eps) -> tuple[jax.Array, jax.Array]:
    """Epsilon-greedy actions of the environments of global indices `ids` from their Q-values
    [E, A], and the keys their environment steps take: every environment's randomness comes
    from its global index (vec.env_keys), so acting does not depend on the device count."""
    keys = acting_keys(key, ids)
    return explored(q, keys[:, 0], eps), keys[:, 1]


def acting_keys(key: jax.Array, ids: jax.Array) -> jax.Array:
    """[E, 2] keys of the environments of global indices `ids`: exploring's, and their step's."""
    return jax.vmap(jax.random.split)(vec.env_keys(key, ids))


def explored(q: jax.Array, choice_keys: jax.Array, eps) -> jax.Array:
    """The greedy actions of Q-values [E, A], each replaced by a random one with probability eps."""
    choice = jax.vmap(jax.random.split)(choice_keys)  # whether to explore, and the random action if so
    explore = jax.vmap(jax.random.uniform)(choice[:, 0]) < eps
    random = jax.vmap(lambda k: jax.random.randint(k, (), 0, q.shape[-1]))(choice[:, 1])
    return jnp.where(explore, random, jnp.argmax(q, axis=-1))


def make_actor(env, env_params, qf: QFunctions, envs_per_device: int):
    """`act(params, envs, memory, key, eps) -> next envs, memory, action, vec.Step`: one
    epsilon-greedy step of this device's environments (inside a mapped function), what --mode
    both's rollout and the asynchronous collectors take."""

    def act(params, envs: vec.EnvBatch, memory, key: jax.Array, eps):
        q, memory = qf.act(params, memory, envs.obs)
        action, step_keys = epsilon_greedy(q, key, global_indices(envs_per_device), eps)
        next_envs, out = vec.step(env, env_params, envs, action, step_keys)
        return next_envs, qf.remember(memory, action, out.reward, out.terminated | out.truncated), action, out

    return act


class QFunctions(NamedTuple):
    """The Q-network's views: params and memory to start from; acting one step (a transformer
    also advances its cache); the learner's Q of a batch (observations, or windows); and the
    epsilon-greedy (eps-end) policy for evaluation."""
    sequence: bool
    init_params: Any
    init_memory: Any
    act: Any
    remember: Any
    learner: Any
    policy: Policy


def q_functions(cfg, net, env, obs_shape: tuple) -> QFunctions:
    sequence = factory.is_sequence_policy(cfg)  # Q from the recent history, not one observation

    def init_params(key: jax.Array):
        if not sequence:
            return net.init(key, jnp.zeros((1,) + obs_shape))
        one = lambda shape, dtype: jnp.zeros((1, 1) + shape, dtype)  # noqa: E731
        return net.init(key, None, one(obs_shape, jnp.float32), one((), jnp.int32), one((), jnp.float32),
                        jnp.ones((1, 1), bool))

    def init_memory(n: int):
        return Memory(net.init_cache(n), jnp.zeros(n, jnp.int32), jnp.zeros(n), jnp.ones(n, bool)) if sequence else ()

    def act_q(params, memory, obs):
        """Q-values of this step's observations; a transformer also advances its cache."""
        if not sequence:
            return net.apply(params, obs), memory
        q, _, cache = net.apply(params, memory.cache, obs, memory.prev_action, memory.prev_reward, memory.is_first,
                                method=net.step)
        return q, memory._replace(cache=cache)

    def remember(memory, action, reward, done):
        return Memory(memory.cache, action.astype(jnp.int32), reward.astype(jnp.float32), done) if sequence else memory

    def learner_q(params, x):
        """Q-values for the learner: of observations [B, ...], or at the last token of windows."""
        if not sequence:
            return net.apply(params, x)
        logits, _, _ = net.apply(params, None, x.obs, x.prev_action, x.prev_reward, x.is_first, valid=x.valid)
        return logits[:, -1]

    def policy_logits(q):
        """log of the epsilon-greedy (eps-end) action probabilities, and max Q as the value."""
        greedy = jax.nn.one_hot(jnp.argmax(q, -1), env.num_actions)
        probs = cfg.eps_end / env.num_actions + (1.0 - cfg.eps_end) * greedy
        return jnp.log(probs), q.max(-1)

    def policy_act(params, memory, obs, final_obs):
        q, memory = act_q(params, memory, obs)
        logits, value = policy_logits(q)
        return logits, value, jnp.zeros_like(value), memory

    def policy_evaluate(params, memory0, inputs):
        if not sequence:
            return policy_logits(net.apply(params, inputs))
        return policy_logits(net.apply(params, memory0.cache, *inputs)[0])

    policy = Policy(init_params=init_params, init_memory=init_memory, act=policy_act, remember=remember,
                    inputs=lambda memory, obs: (obs, memory.prev_action, memory.prev_reward, memory.is_first)
                    if sequence else obs, evaluate=policy_evaluate, sequences=sequence)

    return QFunctions(sequence, init_params, init_memory, act_q, remember, learner_q, policy)


def q_policy(cfg, env, env_params) -> Policy:
    """The Q-network's epsilon-greedy (or greedy) policy (the spec's `policy`)."""
    return q_functions(cfg, make_network(cfg, env, env_params), env, env.observation_space(env_params).shape).policy


def policy(run: Resolved) -> Policy:
    return q_policy(run.cfg, run.env, run.env_params)


def make(cfg, env, env_params, split: BatchSplit) -> Algo:
    net = make_network(cfg, env, env_params)
    tx = learner.adam(cfg, gradient_steps(cfg))
    envs_per_device = split.environments.per_device
    rows = cfg.buffer_size // cfg.num_envs  # steps of each environment the replay holds
    batch_per_device = split.minibatch.per_device
    grad_steps = grad_steps_per_update(cfg)
    learn_from = first_learning_update(cfg)
    obs_shape = env.observation_space(env_params).shape
    obs_dtype = stored_obs_dtype(cfg)

    frames = stores_frames(cfg, env, env_params)
    add = frame_replay_add if frames else replay_add
    qf = q_functions(cfg, net, env, obs_shape)
    sequence, init_params, init_memory, _, _, learner_q, policy = qf

    def init(key: jax.Array) -> DQNState:
        params_key, env_key, key = jax.random.split(key, 3)
        params = init_params(params_key)
        envs = vec.reset(env, env_params, env_key, global_indices(envs_per_device))
        zero = jnp.zeros((), jnp.int32)
        replay = (frame_replay_init(envs_per_device, rows, obs_shape) if frames else
                  replay_init(envs_per_device, rows, obs_shape, obs_dtype))
        return DQNState(params, params, tx.init(params), learner.LossScale.init(cfg.precision), envs,
                        init_memory(envs_per_device), replay, key, zero, zero)

    act = make_actor(env, env_params, qf, envs_per_device)
    pipelined = vec.pipelined(env, envs_per_device, memoryless=not sequence)

    def rollout(params, envs: vec.EnvBatch, memory, replay: Replay, key: jax.Array, written: jax.Array):
        """`num_steps` epsilon-greedy vector steps, from the `written`-th vector step of training."""

        def step(carry, t):
            envs, memory, replay = carry
            eps = epsilon(cfg, (written + t).astype(jnp.float32) * cfg.num_envs)  # env steps so far
            next_envs, memory, action, out = act(params, envs, memory, jax.random.fold_in(key, t), eps)
            replay = add(replay, written + t, envs.obs, action, out)
            return (next_envs, memory, replay), (action, eps, out)

        if not pipelined:
            (envs, memory, replay), (actions, eps, steps) = jax.lax.scan(step, (envs, memory, replay),
                                                                         jnp.arange(cfg.num_steps))
            return envs, memory, replay, actions, eps, steps
        # host games in two halves (vec.scan_halves): the same keys and epsilons, drawn beforehand
        ts = jnp.arange(cfg.num_steps)
        eps = epsilon(cfg, (written + ts).astype(jnp.float32) * cfg.num_envs)
        keys = jax.vmap(lambda t: acting_keys(jax.random.fold_in(key, t), global_indices(envs_per_device)))(ts)

        def act_half(obs, final_obs, x):
            choice_keys, half_eps = x
            action = explored(qf.act(params, memory, obs)[0], choice_keys, half_eps)
            return action, (obs, action)

        every_env = jnp.broadcast_to(eps[:, None], keys.shape[:2])
        envs, _, (obs, actions), steps = vec.scan_halves(
            env, env_params, envs, envs.obs, act_half, (keys[:, :, 0], every_env), keys[:, :, 1])
        replay = jax.lax.fori_loop(0, cfg.num_steps, lambda t, replay: add(
            replay, written + t, obs[t], actions[t], jax.tree.map(lambda x: x[t], steps)), replay)
        return envs, memory, replay, actions, eps, steps

    learn, train_step = make_train_step(cfg, learner_q, tx, sequence)

    def learn_many(carry, replay: Replay, written: jax.Array, key: jax.Array):
        """`grad_steps` gradient steps, each on a fresh sample; returns the carry and mean stats."""
        key = jax.random.fold_in(key, device_index())  # each device samples its own share

        def draw(k):
            if frames:
                return frame_replay_sample(replay, written, jax.random.fold_in(key, k), batch_per_device, cfg.n_step,
                                           cfg.gamma, obs_shape[0])
            return replay_sample(replay, written, jax.random.fold_in(key, k), batch_per_device, cfg.n_step, cfg.gamma,
                                 cfg.context_len if sequence else 0)
        return sampled_steps(train_step, draw, carry, jnp.arange(grad_steps))

    def no_learning(carry, replay, written, key):
        # zeros shaped like learn_many's stats (traced abstractly: nothing is computed)
        stats = jax.eval_shape(learn_many, carry, replay, written, key)[1]
        return carry, jax.tree.map(zeros, stats)

    def update(state: DQNState):
        key, act_key, learn_key = jax.random.split(state.key, 3)
        written = state.update * cfg.num_steps  # vector steps so far
        envs, memory, replay, _, eps, steps = rollout(state.params, state.envs, state.memory, state.replay, act_key,
                                                      written)
        written = written + cfg.num_steps
        # The same on every device (all count the same steps), so all take the same branch.
        # a frame replay's first transition needs its stack's rows and the row of its s' too
        learning = jnp.logical_and(state.update >= learn_from, written >= cfg.n_step + (obs_shape[0] if frames else 0))
        carry = (state.params, state.target_params, state.opt_state, state.loss_scale, state.grad_steps)
        (params, target_params, opt_state, loss_scale, n), losses = jax.lax.cond(
            learning, learn_many, no_learning, carry, replay, written, learn_key)
        losses = {**losses, "epsilon": eps.mean()}
        if "fp16/loss_scale" in losses:  # the scale in force, also before learning starts
            losses["fp16/loss_scale"] = loss_scale.scale
        new = DQNState(params, target_params, opt_state, loss_scale, envs, memory, replay, key, state.update + 1, n)
        return new, (losses, vec.EpisodeStats.of(steps.done_return, steps.done_length, steps.episode_metrics))

    return Algo(init, update, rollout, init_params, policy, learn, train_step)


def algorithm(run: Resolved) -> Algorithm[Algo]:
    algo = make(run.cfg, run.env, run.env_params, run.split)
    return Algorithm(algo.init, algo.update, STATE_LAYOUT, algo.policy,
                     parts=algo)
