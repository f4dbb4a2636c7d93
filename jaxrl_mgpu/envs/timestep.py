"""The dm_env / Jumanji `TimeStep` contract as this project's environment API: Jumanji,
XLand-MiniGrid and Navix behind `--env jumanji:TASK`, `xminigrid:TASK` and `navix:TASK`.

A TimeStep carries `step_type` (FIRST, MID, LAST), `reward`, `discount` and `observation`
(Jumanji's adds `extras`). It also says how an episode ended: a LAST step with `discount == 0`
is an absorbing state (`terminated`: no bootstrap), one that ends with `discount > 0` was cut
off (`truncated`: the learners bootstrap from its observation). Navix's Timestep has no
discount and names the two ends itself (`StepType.TERMINATION`, `StepType.TRUNCATION`).

`TimeStepEnv` is a gymnax `Environment`, so gymnax's `step` resets an ended episode (drawing
the new one from the step's key) and keeps the observation it ended on in
`info["final_observation"]`. On top of the suite's own ends, an episode that reaches
`params.max_steps_in_episode` steps is truncated; by default that is the suite's own limit,
which the suite reaches first and ends as it defines. Jumanji's tasks with a time limit
(Snake, Maze, PacMan, SlidingTilePuzzle) end it with discount 0, and each puts its step count
in the observation, so the limit is part of the task they define: those ends are `terminated`.
Jumanji's tasks without a time limit end within a known number of steps (`_JUMANJI_LIMITS`),
except Game2048, whose episodes this adapter truncates at `GAME_2048_STEPS`.

Observations become one float32 vector (`observation_array`): every leaf of the suite's
observation in `jax.tree.leaves` order (a NamedTuple's fields as declared, nested ones depth
first), each raveled row-major, concatenated. Jumanji's are NamedTuples of grids, step counts
and action masks. Navix's symbolic grid [H, W, 3] and XLand-MiniGrid's view [7, 7, 2] hold ids
(entity or tile, colour, state), not pixels: PPO learns from them flattened as well as through
the conv torso that rank-3 observations get (nets/mlp.py), and steps many times faster
(README: Other suites).

Refused here, with the reason in one line: Jumanji tasks whose action is not one discrete
choice (several choices at once, or continuous, often one per agent) and Sokoban (it downloads
its levels), and XLand-MiniGrid's XLand-* tasks (their rulesets come from benchmarks it
downloads). The suites' packages are imported inside the functions that build their
environments, so only a run that uses a suite needs its extra.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from jaxrl_mgpu.envs.registry import EnvError, Suite, register_suite

# dm_env's (and Jumanji's, XLand-MiniGrid's) StepType.LAST; Navix's ends.
LAST = 2
NAVIX_TRUNCATION, NAVIX_TERMINATION = 1, 2
# Game2048 has no step limit of its own. Each move adds a 2 or a 4 to the board, so reaching the
# 2048 tile takes about 1,000 moves: this cuts off only play far beyond that.
GAME_2048_STEPS = 10_000


@struct.dataclass
class State(environment.EnvState):
    suite: Any             # what the suite steps from: Jumanji's State, XLand-MiniGrid's or Navix's TimeStep
    terminated: jax.Array  # bool: the step into this state ended its episode in an absorbing state
    truncated: jax.Array   # bool: ... or cut it off (a time limit)


@struct.dataclass
class Params(environment.EnvParams):
    suite: Any = None     # XLand-MiniGrid's EnvParams (static fields only); None for Jumanji and Navix


def observation_array(observation: Any) -> jax.Array:
    """One float32 vector: every leaf in `jax.tree.leaves` order, raveled, concatenated."""
    return jnp.concatenate([jnp.ravel(jnp.asarray(leaf, jnp.float32)) for leaf in jax.tree.leaves(observation)])


def dm_env_ends(timestep: Any) -> tuple[jax.Array, jax.Array]:
    """(terminated, truncated) of a dm_env-style TimeStep: its last step ends an episode,
    absorbing where the discount is 0, cut off where it is not."""
    last = timestep.step_type == LAST
    absorbing = timestep.discount == 0
    return last & absorbing, last & ~absorbing


def navix_ends(timestep: Any) -> tuple[jax.Array, jax.Array]:
    """(terminated, truncated) of a Navix Timestep, from its own step types."""
    return timestep.step_type == NAVIX_TERMINATION, timestep.step_type == NAVIX_TRUNCATION


class TimeStepEnv(environment.Environment):
    """A gymnax Environment over one suite's TimeStep environment. A subclass says how the suite
    starts and steps (`_start`, `_advance`: each returns what the suite steps from next and the
    TimeStep it produced) and how a TimeStep ended (`ends`). The suites keep their own random
    keys in their states, so the step's key is not used; a reset draws from its key."""

    ends = staticmethod(dm_env_ends)

    def __init__(self, name: str, num_actions: int, params: Params):
        self._name, self._num_actions, self._params = name, num_actions, params

    def _start(self, key: jax.Array, suite_params: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def _advance(self, carry: Any, action: jax.Array, suite_params: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def _info(self, timestep: Any) -> dict:
        return {}

    @property
    def default_params(self) -> Params:
        return self._params

    def reset_env(self, key: jax.Array, params: Params) -> tuple[jax.Array, State]:
        carry, timestep = self._start(key, params.suite)
        no = jnp.array(False)
        state = State(time=jnp.int32(0), suite=carry, terminated=no, truncated=no)
        return observation_array(timestep.observation), state

    def step_env(self, key: jax.Array, state: State, action: jax.Array,
                 params: Params) -> tuple[jax.Array, State, jax.Array, jax.Array, dict]:
        carry, timestep = self._advance(state.suite, action, params.suite)
        terminated, truncated = self.ends(timestep)
        time = state.time + 1
        truncated = (truncated | (time >= params.max_steps_in_episode)) & ~terminated
        reward = jnp.asarray(timestep.reward, jnp.float32)
        state = State(time=time, suite=carry, terminated=terminated, truncated=truncated)
        return observation_array(timestep.observation), state, reward, terminated, self._info(timestep)

    def is_truncated(self, state: State, params: Params) -> jax.Array:
        return state.truncated

    def is_terminated(self, state: State, params: Params) -> jax.Array:
        return state.terminated

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_actions(self) -> int:
        return self._num_actions

    def action_space(self, params: Params | None = None) -> spaces.Discrete:
        return spaces.Discrete(self._num_actions)

    @functools.cached_property
    def _observation_shape(self) -> tuple[int, ...]:
        obs, _ = jax.eval_shape(self.reset_env, jax.random.PRNGKey(0), self._params)
        return obs.shape

    def observation_space(self, params: Params | None = None) -> spaces.Box:
        return spaces.Box(-jnp.inf, jnp.inf, self._observation_shape, jnp.float32)


# -- Jumanji -----------------------------------------------------------------------------------

class JumanjiEnv(TimeStepEnv):
    def __init__(self, name: str, env: Any, num_actions: int, params: Params):
        super().__init__(name, num_actions, params)
        self.suite_env = env

    def _start(self, key, suite_params):
        return self.suite_env.reset(key)

    def _advance(self, carry, action, suite_params):
        return self.suite_env.step(carry, action)

    def _info(self, timestep):
        return dict(timestep.extras or {})

    def render_rgb(self, state: State, params: Params | None = None) -> np.ndarray:
        """One state drawn by the task's own matplotlib viewer (evaluate --video)."""
        return np.array(self._viewer.render(state.suite)[..., :3])

    @functools.cached_property
    def _viewer(self):
        import matplotlib
        matplotlib.use("Agg")  # frames only, no display
        viewer = self.suite_env._viewer  # every offered task's viewer is a jumanji MatplotlibViewer
        viewer._display = viewer._display_rgb_array  # its "rgb_array" render mode: the drawn figure as an array
        viewer.figure_size = (4.8, 4.8)  # 480 x 480 pixels at matplotlib's 100 dpi (its default: 1000 x 1000)
        return viewer


# Tasks that are not offered, and why. Each task's action spec was read from Jumanji 1.1.2 (a
# test checks this table against the suite); `make` checks the spec of whatever it builds too.
_SEVERAL_CHOICES = "its action is several discrete choices at once (a MultiDiscreteArray)"
_JUMANJI_REFUSED = {
    **{task: _SEVERAL_CHOICES for task in (
        "BinPack-v2", "FlatPack-v0", "JobShop-v0", "Minesweeper-v0", "RubiksCube-v0",
        "RubiksCube-partly-scrambled-v0", "Sudoku-v0", "Sudoku-very-easy-v0", "Tetris-v0")},
    **{task: _SEVERAL_CHOICES + ", one per agent" for task in (
        "Cleaner-v0", "Connector-v3", "LevelBasedForaging-v0", "MMST-v0", "RobotWarehouse-v0")},
    "MultiCVRP-v0": "its action is one node per vehicle (an integer array of several choices)",
    "SearchAndRescue-v0": "its action is continuous, a 2-D velocity per agent",
    "Sokoban-v0": "it downloads its levels (DeepMind's Boxoban) from the Hugging Face Hub when it is made",
}
_ONE_CHOICE = "; the policies here take one discrete choice"
# Episode limits of the tasks without a `time_limit`: the most steps an episode can take.
_JUMANJI_LIMITS = {
    "CVRP-v1": lambda env: 2 * env.num_nodes,   # a customer or the depot each step, never the depot twice running
    "GraphColoring-v1": lambda env: env.num_nodes,   # one node coloured a step
    "Knapsack-v1": lambda env: env.num_items,        # one item packed a step
    "TSP-v1": lambda env: env.num_cities,            # one city visited a step
    "Game2048-v1": lambda env: GAME_2048_STEPS,      # unlimited in Jumanji: truncated here
}


def _jumanji_tasks() -> list[str]:
    import jumanji
    return sorted(t for t in jumanji.registered_environments() if t not in _JUMANJI_REFUSED)


def _jumanji_refuse(task: str) -> str | None:
    why = _JUMANJI_REFUSED.get(task)
    return why + (_ONE_CHOICE if "action" in why else "") if why else None


def make_jumanji(task: str) -> tuple[JumanjiEnv, Params]:
    import jumanji
    from jumanji import specs
    env = jumanji.make(task)
    spec = env.action_spec
    if not isinstance(spec, specs.DiscreteArray):
        raise EnvError(f"--env jumanji:{task} is not supported: its action spec is a {type(spec).__name__} of shape "
                       f"{spec.shape}{_ONE_CHOICE}")
    if task in _JUMANJI_LIMITS:
        limit = _JUMANJI_LIMITS[task](env)
    elif hasattr(env, "time_limit"):
        limit = env.time_limit
    else:
        raise EnvError(f"--env jumanji:{task} is not supported: it has no time limit and no known bound on its "
                       f"episodes' length")
    params = Params(max_steps_in_episode=int(limit))
    return JumanjiEnv(f"jumanji:{task}", env, int(spec.num_values), params), params


# -- XLand-MiniGrid ----------------------------------------------------------------------------

class XMiniGridEnv(TimeStepEnv):
    def __init__(self, name: str, env: Any, params: Params):
        super().__init__(name, int(env.num_actions(params.suite)), params)
        self.suite_env = env

    def _start(self, key, suite_params):
        timestep = self.suite_env.reset(suite_params, key)
        return timestep, timestep

    def _advance(self, carry, action, suite_params):
        timestep = self.suite_env.step(suite_params, carry, action)
        return timestep, timestep

    def render_rgb(self, state: State, params: Params | None = None) -> np.ndarray:
        """One state drawn by XLand-MiniGrid's own renderer (evaluate --video): the grid, the
        agent's view lit."""
        params = self._params if params is None else params
        return np.asarray(self.suite_env.render(params.suite, state.suite))


def _xminigrid_tasks() -> list[str]:
    import xminigrid
    return [t for t in xminigrid.registered_environments() if not t.startswith("XLand-")]


def _xminigrid_refuse(task: str) -> str | None:
    if task.startswith("XLand-"):
        return ("XLand-MiniGrid's rulesets come from its benchmarks, which it downloads from the internet; the "
                "MiniGrid-* tasks are offered")
    return None


def make_xminigrid(task: str) -> tuple[XMiniGridEnv, Params]:
    import xminigrid
    env, env_params = xminigrid.make(task)
    params = Params(max_steps_in_episode=int(env_params.max_steps), suite=env_params)
    return XMiniGridEnv(f"xminigrid:{task}", env, params), params


# -- Navix -------------------------------------------------------------------------------------

class NavixEnv(TimeStepEnv):
    ends = staticmethod(navix_ends)

    def __init__(self, name: str, env: Any, params: Params):
        super().__init__(name, len(env.action_set), params)
        self.suite_env = env

    def _start(self, key, suite_params):
        timestep = self.suite_env.reset(key)
        return timestep, timestep

    def _advance(self, carry, action, suite_params):
        # `_step` is Navix's step without the auto-reset it defers to the next call (0.7.4 and
        # 4.0.0 alike): this adapter resets an episode the moment it ends, so that reset never
        # fires, yet under vmap its branch would be computed on every step.
        timestep = self.suite_env._step(carry, action)
        return timestep, timestep

    def render_rgb(self, state: State, params: Params | None = None) -> np.ndarray:
        """One state drawn with Navix's sprites (evaluate --video): the whole grid, each pixel
        repeated to make it about 256 pixels on its longer side (navix 0.7.4's sprites are 8
        pixels)."""
        image = np.asarray(self._drawing(state.suite.state))
        k = max(1, 256 // max(image.shape[:2]))
        return image.repeat(k, axis=0).repeat(k, axis=1)

    @functools.cached_property
    def _drawing(self):
        import navix
        return jax.jit(navix.observations.rgb)


def _navix_tasks() -> list[str]:
    import navix
    return sorted(navix.registry())


def make_navix(task: str) -> tuple[NavixEnv, Params]:
    import navix
    env = navix.make(task)
    params = Params(max_steps_in_episode=int(env.max_steps))
    return NavixEnv(f"navix:{task}", env, params), params


register_suite("jumanji", Suite(tasks=_jumanji_tasks, make=make_jumanji, extra="jumanji", requires=("jumanji",),
                                refuse=_jumanji_refuse))
register_suite("xminigrid", Suite(tasks=_xminigrid_tasks, make=make_xminigrid, extra="xminigrid",
                                  requires=("xminigrid",), refuse=_xminigrid_refuse))
register_suite("navix", Suite(tasks=_navix_tasks, make=make_navix, extra="navix", requires=("navix",)))
