"""Environments with the Brax `State` contract, as gymnax environments, and the two suites
that have it:

- `brax:TASK`, the environments of `brax.envs` (ant, humanoid, halfcheetah, ...), on the
  physics backend Brax's own trainer uses unless told otherwise (`mjx`); `--env-args
  backend=generalized|positional|spring` picks another. Swimmer is refused: it needs a part of
  brax 0.14.2 that jax 0.10 broke;
- `dmc:TASK`, MuJoCo Playground's DM Control suite (CartpoleBalance, CheetahRun,
  HumanoidWalk, ...) on MJX's JAX implementation (`impl="jax"`). Playground's default, Warp,
  needs the warp-lang wheel and a CUDA device; its locomotion and manipulation tasks clone a
  repository of robot models from GitHub on first use: they are refused in one line.

Such an environment has `reset(rng) -> State` and `step(state, action) -> State`, the State
holding `obs`, `reward`, `done`, `info` and `metrics`, and its `done` says only that the
episode terminated. `BraxStateEnv` adds what the project's environment API needs
(envs/registry.py):

- the time limit, as Brax's EpisodeWrapper keeps it: an episode lasts `episode_length` of the
  suite's steps, `ceil(episode_length / action_repeat)` of ours (`params.max_steps_in_episode`);
  reaching it is `truncated` (the wrapper's `truncation`), never `terminated`;
- `action_repeat`: each action is applied that many times and the rewards summed; an episode
  that terminates on one of them stays where it ended for the rest;
- the reset inside `step`, with the observation the episode ended on in
  `info["final_observation"]`. By default an environment starts every episode from the state
  its first reset drew, kept in its EnvState, as Brax's and Playground's training wrappers do
  (the results both publish were trained so); `--env-args fresh_reset=true` draws a new start
  from the step's key at every episode's end instead. That computes a reset in every step of
  every environment (under vmap both sides of the choice are computed), which costs little
  for most tasks but 200 physics steps for dmc:CheetahRun, whose reset lets the model settle;
- the physics in full float32: the suite's reset and step are traced under
  `jax.default_matmul_precision("highest")`. On Ampere and later GPUs XLA otherwise runs
  float32 matmuls in TF32, which MuJoCo Playground names as a cause of unstable training and
  its own trainer overrides globally; here only the physics pays for it, the networks keep the
  fast default. `--env-args physics_precision=default` leaves the physics at jax's own setting;
- a step whose physics blew up (a non-finite observation or reward: MJX's positions and
  velocities can turn NaN under extreme contacts) terminates its episode with reward 0, as
  Playground's own tasks end such an episode (`done` on a NaN position or velocity; Brax's do
  not end it at all). Otherwise one environment's NaN reward would make a whole update's loss
  non-finite and stop the run. The fraction of episodes that ended so is logged as
  `env/physics_blew_up`;
- observations float32 `[obs_size]`; where a task's observation is a dict, its `"state"`
  entry (what the policy sees; Playground's asymmetric tasks give the critic a
  `"privileged_state"`, which this project's shared-input actor-critic does not use).

No Python branch here depends on a traced value, so it runs under vmap, scan, pmap and
shard_map.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces
from jax import lax

from jaxrl_mgpu.cli import UserError
from jaxrl_mgpu.envs.registry import COUNT, FLAG, Arg, EnvError, Suite, register_suite

# Brax's physics pipelines (brax.envs.base.PipelineEnv); `mjx` is its trainer's default
# (brax.training.learner's --backend).
BRAX_BACKENDS = ("mjx", "generalized", "positional", "spring")
# What Brax's trainer uses unless told otherwise: 1,000 steps an episode, each action once.
BRAX_EPISODE_LENGTH, BRAX_ACTION_REPEAT = 1000, 1

# float32 matmuls in the physics ("highest"), or jax's own setting ("default": on an Ampere or
# later GPU, TF32 unless JAX_DEFAULT_MATMUL_PRECISION says otherwise).
PHYSICS_PRECISIONS = ("highest", "default")
PRECISION_ARG = Arg(str, choices=PHYSICS_PRECISIONS)
BRAX_ARGS = {"episode_length": COUNT, "action_repeat": COUNT, "fresh_reset": FLAG,
             "backend": Arg(str, choices=BRAX_BACKENDS), "physics_precision": PRECISION_ARG}
# Defaults: the task's own config (every DM Control task: 1,000 steps, action_repeat 1).
DMC_ARGS = {"episode_length": COUNT, "action_repeat": COUNT, "fresh_reset": FLAG,
            "physics_precision": PRECISION_ARG}


@struct.dataclass
class EnvState(environment.EnvState):
    suite_state: Any  # the suite's own State (physics data, obs, reward, done, info, metrics), held: see _held
    start: Any        # the held State every episode starts from (None with fresh_reset)


@struct.dataclass
class EnvParams(environment.EnvParams):
    max_steps_in_episode: int = 1000  # steps of ours: ceil(episode_length / action_repeat)


class BraxStateEnv(environment.Environment):
    """A gymnax environment around `suite_env` (Brax `State` contract): see the module's
    docstring. `name` is what `--env` called it."""

    heavy_step = True  # a step is a physics simulation: PPO's rollout loop is not unrolled (algos/ppo/ppo.py)
    # logged as env/physics_blew_up: the fraction of episodes that physics blowing up ended
    episode_metrics = ("physics_blew_up",)

    def __init__(self, suite_env, name: str, episode_length: int, action_repeat: int, fresh_reset: bool = False,
                 physics_precision: str = "highest"):
        self.suite_env = suite_env
        self._name = name
        self.episode_length = episode_length
        self.action_repeat = action_repeat
        self.fresh_reset = fresh_reset
        self.physics_precision = physics_precision
        # The shapes and types of a reset State, without running anything (tracing compiles nothing).
        self._first = jax.eval_shape(suite_env.reset, jax.random.PRNGKey(0))
        obs = self._first.obs
        if isinstance(obs, Mapping):
            if "state" not in obs:
                raise EnvError(f"--env {name}: its observations are a dict of {', '.join(obs)} with no 'state' "
                               f"entry (a vector for the policy); only those with one are supported")
            obs = obs["state"]
        if len(obs.shape) != 1:
            raise EnvError(f"--env {name}: its observations have shape {tuple(obs.shape)}; only vectors are supported")
        self.obs_size = obs.shape[0]
        self.action_size = suite_env.action_size

    @property
    def name(self) -> str:
        return self._name

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(max_steps_in_episode=math.ceil(self.episode_length / self.action_repeat))

    def observation_space(self, params=None) -> spaces.Box:
        return spaces.Box(-jnp.inf, jnp.inf, (self.obs_size,), jnp.float32)

    def action_space(self, params=None) -> spaces.Box:
        # Brax and Playground tasks take actions in [-1, 1] and scale them to their actuators.
        return spaces.Box(-1.0, 1.0, (self.action_size,), jnp.float32)

    def observation(self, suite_state) -> jax.Array:
        obs = suite_state.obs
        return (obs["state"] if isinstance(obs, Mapping) else obs).astype(jnp.float32)

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, EnvState]:
        with self._physics():
            suite_state = self._held(self.suite_env.reset(key))
        start = None if self.fresh_reset else suite_state
        return self.observation(suite_state), EnvState(time=jnp.int32(0), suite_state=suite_state, start=start)

    def step_env(self, key: jax.Array, state: EnvState, action: jax.Array,
                 params: EnvParams) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict]:
        """The transition alone, without the reset: `(obs, state, reward, terminated, info)` of
        the episode going on or just ended (`step` adds the reset; evaluate --video draws these
        states). The suite's step needs no randomness."""
        stepped = self._repeat(state.suite_state, action)
        obs = self.observation(stepped)
        # Physics that blew up (see the module's docstring) ends the episode with reward 0 (a
        # NaN reward would make the whole update's loss NaN) and zeros for its last observation
        # (a termination never bootstraps from it; zeros keep what reads it finite).
        exploded = jnp.logical_not(jnp.isfinite(obs).all() & jnp.isfinite(stepped.reward))
        reward = jnp.where(exploded, 0.0, stepped.reward.astype(jnp.float32))
        obs = jnp.where(exploded, 0.0, obs)
        terminated = jnp.logical_or(stepped.done > 0, exploded)
        going = EnvState(time=state.time + 1, suite_state=stepped, start=state.start)
        return obs, going, reward, terminated, {"physics_blew_up": exploded.astype(jnp.float32)}

    def step(self, key: jax.Array, state: EnvState, action: jax.Array, params: EnvParams | None = None):
        """`(obs, state, reward, terminated, truncated, info)`; where the episode ended, `obs` and
        `state` are those of the next one's start (with fresh_reset, drawn from `key`), and
        `info["final_observation"]` the observation it ended on."""
        params = self.default_params if params is None else params
        final_obs, going, reward, terminated, info = self.step_env(key, state, action, params)
        truncated = jnp.logical_and(self.is_truncated(going, params), jnp.logical_not(terminated))
        done = jnp.logical_or(terminated, truncated)
        if self.fresh_reset:
            obs_next, next_start = self.reset_env(key, params)
        else:  # the start this environment's first reset drew
            obs_next = self.observation(state.start)
            next_start = EnvState(time=jnp.int32(0), suite_state=state.start, start=state.start)
        state = jax.tree.map(lambda start, now: lax.select(done, start, now), next_start, going)
        obs = lax.select(done, obs_next, final_obs)
        return obs, state, reward, terminated, truncated, {"final_observation": final_obs, **info}

    def _repeat(self, held, action: jax.Array):
        """The suite's step applied `action_repeat` times, rewards summed. Once one of them ends
        the episode the state holds still (the episode is over; the rest would step past it)."""
        def once(before):
            with self._physics():
                return self._held(self.suite_env.step(self._whole(before), action))

        if self.action_repeat == 1:
            return once(held)

        def repeat(carry, _):
            before, total = carry
            after = once(before)
            over = before.done > 0
            kept = jax.tree.map(lambda old, new: lax.select(over, old, new), before, after)
            return (kept, total + jnp.where(over, 0.0, after.reward)), None

        (last, total), _ = lax.scan(repeat, (held, jnp.zeros_like(held.reward)), None, length=self.action_repeat)
        return last.replace(reward=total)

    # -- evaluate --video ------------------------------------------------------------------

    @property
    def render_fps(self) -> float:
        """Real time (a step is dt x action_repeat seconds), at most 50 frames a second: GIF
        players slow faster ones down."""
        return min(50.0, 1.0 / (float(self.suite_env.dt) * self.action_repeat))

    def render_rgb(self, state: EnvState, params: EnvParams | None = None) -> np.ndarray:
        """One state drawn by MuJoCo's renderer, as Brax's and Playground's own `render` draw
        it: 320 x 240 pixels (a video's frame adds a 16-pixel strip with the step number), from
        the model's first camera that follows a body, else its first camera, else MuJoCo's free
        camera."""
        import mujoco
        physics = self._whole(state.suite_state)
        physics = physics.pipeline_state if hasattr(physics, "pipeline_state") else physics.data  # Brax's, Playground's
        qpos, qvel = (physics.q, physics.qd) if hasattr(physics, "q") else (physics.qpos, physics.qvel)
        data = mujoco.MjData(self._mj_model)
        data.qpos, data.qvel = np.asarray(qpos), np.asarray(qvel)
        mujoco.mj_forward(self._mj_model, data)
        renderer, camera = self._renderer
        renderer.update_scene(data, camera=camera)
        return renderer.render()

    @property
    def _mj_model(self):
        return self.suite_env.sys.mj_model if hasattr(self.suite_env, "sys") else self.suite_env.mj_model

    @functools.cached_property
    def _renderer(self):
        import mujoco
        model = self._mj_model
        follows = (int(mujoco.mjtCamLight.mjCAMLIGHT_TRACK), int(mujoco.mjtCamLight.mjCAMLIGHT_TRACKCOM))
        tracking = [i for i in range(model.ncam) if int(model.cam_mode[i]) in follows]
        camera = tracking[0] if tracking else (0 if model.ncam else -1)
        try:
            return mujoco.Renderer(model, height=240, width=320), camera
        except Exception as e:  # no OpenGL platform: mujoco raises ImportError, RuntimeError or its FatalError
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(f"--video: MuJoCo could not open an OpenGL context (MUJOCO_GL="
                            f"{os.environ.get('MUJOCO_GL', '')}): {why}; without a display it needs EGL (Debian: "
                            f"apt install libegl1 libgl1-mesa-dri) or MUJOCO_GL=osmesa (libosmesa6)") from None

    def _physics(self):
        """Where the suite's physics is traced: at float32 precision, or (`default`) at whatever
        jax's own setting is (`JAX_DEFAULT_MATMUL_PRECISION`)."""
        if self.physics_precision == "default":
            return contextlib.nullcontext()
        return jax.default_matmul_precision(self.physics_precision)

    def _held(self, suite_state):
        """What EnvState keeps of a suite's State: every leaf an array of the type it has after a
        reset, never weakly typed (Brax's tasks step some leaves as Python floats, and a carried
        state must keep its types from step to step), and no array of size 0 (None in its place:
        MJX keeps, e.g., the contacts of a model that has none as [0, ...] arrays, which hold
        nothing, and which Orbax refuses to save)."""
        def hold(model, leaf):
            if model.size == 0:
                return None
            leaf = jnp.asarray(leaf)
            return leaf if jax.dtypes.issubdtype(model.dtype, jax.dtypes.extended) else lax.convert_element_type(
                leaf, model.dtype)

        return jax.tree.map(hold, self._first, suite_state)

    def _whole(self, held):
        """The suite's State again: its arrays of size 0 put back."""
        return jax.tree.map(lambda model, leaf: jnp.zeros(model.shape, model.dtype) if leaf is None else leaf,
                            self._first, held)


# ---------------------------------------------------------------------------------------------
# The suites. Each function imports its suite (only a run that uses it needs its extra).
# ---------------------------------------------------------------------------------------------

def _brax_tasks() -> list[str]:
    from brax import envs as brax_envs
    return sorted(brax_envs._envs)  # brax's registry (get_environment reads it); no public listing


def _refuse_brax(task: str) -> str | None:
    if task == "swimmer":
        return ("brax 0.14.2's swimmer runs only on the generalized backend, whose fluid model calls "
                "jnp.clip(a_min=...), which jax 0.10 removed")
    return None


def _make_brax(task: str, episode_length: int = BRAX_EPISODE_LENGTH, action_repeat: int = BRAX_ACTION_REPEAT,
               fresh_reset: bool = False, backend: str = "mjx",
               physics_precision: str = "highest") -> tuple[BraxStateEnv, EnvParams]:
    return _built("brax", task, episode_length, action_repeat, fresh_reset, physics_precision, backend)


def _dmc_tasks() -> list[str]:
    from mujoco_playground import dm_control_suite
    return list(dm_control_suite.ALL_ENVS)


def _make_dmc(task: str, episode_length: int | None = None, action_repeat: int | None = None,
              fresh_reset: bool = False, physics_precision: str = "highest") -> tuple[BraxStateEnv, EnvParams]:
    from mujoco_playground import dm_control_suite
    config = dm_control_suite.get_default_config(task)
    return _built("dmc", task, config.episode_length if episode_length is None else episode_length,
                  config.action_repeat if action_repeat is None else action_repeat, fresh_reset, physics_precision)


def _refuse_dmc(task: str) -> str | None:
    from mujoco_playground import locomotion, manipulation
    for kind, module in (("locomotion", locomotion), ("manipulation", manipulation)):
        if task in module.ALL_ENVS:
            return (f"{task} is a MuJoCo Playground {kind} task: it clones a repository of robot models "
                    f"(mujoco_menagerie) from GitHub on first use, which a machine without internet cannot; dmc "
                    f"offers the DM Control suite")
    return None


def _built(suite: str, task: str, episode_length: int, action_repeat: int, fresh_reset: bool,
           physics_precision: str, backend: str | None = None) -> tuple[BraxStateEnv, EnvParams]:
    """The adapter of a task with its arguments. Building one reads and compiles a MuJoCo model:
    the registry's cache (envs.make) builds it once per name and arguments."""
    if suite == "brax":
        from brax import envs as brax_envs
        with warnings.catch_warnings():
            # brax asks its users to move to MJX; backend="mjx" is MJX already
            warnings.filterwarnings("ignore", message="Brax System, piplines and environments are not actively")
            try:
                suite_env = brax_envs.get_environment(task, backend=backend)
            except ValueError as e:  # a backend the task does not run on
                raise EnvError(f"--env-args backend={backend}: brax:{task}: {e}") from None
    else:
        from mujoco_playground import dm_control_suite
        suite_env = dm_control_suite.load(task, config_overrides={"impl": "jax"})
    env = BraxStateEnv(suite_env, f"{suite}:{task}", episode_length, action_repeat, fresh_reset, physics_precision)
    return env, env.default_params


register_suite("brax", Suite(tasks=_brax_tasks, make=_make_brax, extra="brax", requires=("brax",), args=BRAX_ARGS,
                             refuse=_refuse_brax, unlisted=("fast",)))  # brax's own test environment
register_suite("dmc", Suite(tasks=_dmc_tasks, make=_make_dmc, extra="dmc", requires=("mujoco_playground",),
                            args=DMC_ARGS, refuse=_refuse_dmc))
