"""The game of Tag: Salesforce WarpDrive's two example environments, as jittable gymnax
environments with every agent of one game inside one environment.

- `TagGridworld` (WarpDrive's `tag_gridworld`): taggers chase one runner on a square grid of
  cells; the game ends when a tagger steps onto the runner's cell.
- `TagContinuous` (WarpDrive's `tag_continuous`): taggers chase runners on a continuous square;
  agents steer by changing acceleration and heading. A runner is tagged when its nearest
  tagger comes closer than the tagging distance; a tagged runner leaves the game, and the game
  ends when every runner is tagged.

Both keep an agent axis inside one environment, so a batch of games is a plain `vmap`:

- agent order: the taggers first (`0 .. num_taggers - 1`), then the runners;
- `team_ids` (int32 `[num_agents]`, numpy): 0 for a tagger, 1 for a runner, so a trainer can
  route each team to its own policy (`TAGGER`, `RUNNER`);
- observations `[num_agents, obs_dim]` float32, actions `[num_agents]` int32 (both games have a
  discrete action set; `action_space` is the space of ONE agent's action), rewards
  `[num_agents]` float32, and one `terminated` per game. The time limit
  (`state.time >= params.max_steps_in_episode`, WarpDrive's `episode_length`) ends the game
  too: runners are rewarded for reaching it and everyone observes the time, so it is the
  game's end, not a truncation. `env.step` auto-resets the whole game and returns `(obs,
  state, reward, terminated, truncated, info)` with scalar `terminated` and `truncated`
  (always False; info has no "final_observation");
- `state.active` (bool `[num_agents]`) says who is still in the game (taggers always are);
- `info["tags"]` is the number of runners tagged in this step, `info["episode_tags"]` the
  number tagged so far in this episode, this step included (int32 scalars: the second is what
  a trainer reads where an episode ends, since the auto-reset clears `state.tags`);
  `info["active"]` is `state.active` after the step, before any auto-reset (who left in it).

Shapes must be static under `jit`, so whatever fixes a shape (agent counts, the observation
kind, the number of neighbours observed, the number of action levels) is a constructor
argument of the environment; everything else (sizes of the world, episode length, rewards,
speeds) lives in `EnvParams` and may be traced, batched or changed without recompiling.
Defaults are WarpDrive's constructor defaults; `RUN_CONFIG_SIZES` holds the values of its two
training run configs.

The start of a game is drawn from the key passed to `reset` (nothing else is random), so
games are reproducible from their keys and independent under `vmap`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from jaxrl_mgpu.envs.registry import COUNT, FLAG, POSITIVE, REAL, Arg, register

TAGGER, RUNNER = 0, 1
TWO_PI = np.float32(2.0 * math.pi)


def team_ids(num_taggers: int, num_runners: int) -> np.ndarray:
    """int32 `[num_taggers + num_runners]`: 0 (tagger) for the first `num_taggers` agents, then
    1 (runner)."""
    return np.array([TAGGER] * num_taggers + [RUNNER] * num_runners, np.int32)


class _Tag(environment.Environment):
    """What both games share: the agent layout and the per-game episode end."""

    def __init__(self, num_taggers: int, num_runners: int):
        if num_taggers < 1 or num_runners < 1:
            raise ValueError(f"Tag needs at least one tagger and one runner, got {num_taggers} and {num_runners}")
        self.num_taggers = num_taggers
        self.num_runners = num_runners
        self.num_agents = num_taggers + num_runners
        self.team_ids = team_ids(num_taggers, num_runners)
        # Each team's agents, a contiguous range of the agent axis: what a trainer maps its
        # per-team networks over.
        self.teams = {"taggers": (0, num_taggers), "runners": (num_taggers, self.num_agents)}

    def is_terminated(self, state, params) -> jax.Array:
        """The game is over once no runner is left in it, or at its time limit: the limit is
        part of the game (runners are rewarded for reaching it, and everyone observes the
        time), so it is an end, not a truncation, as in WarpDrive."""
        return jnp.logical_not(jnp.any(state.active[self.num_taggers:])) | (state.time >= params.max_steps_in_episode)

    def step(self, key: jax.Array, state, action: jax.Array, params=None):
        """gymnax's auto-resetting step (the same values) with ONE observation a step: of the
        game after the step, or of the new game where it ended. Games never truncate, so there
        is no final observation to bootstrap from (info has none), and the nearest-neighbour
        search of an observation, most of a step's work, runs once instead of twice."""
        params = self.default_params if params is None else params
        key_step, key_reset = jax.random.split(key)
        stepped, reward, info = self.transition(key_step, state, action, params)
        done = self.is_terminated(stepped, params)
        fresh = self.initial_state(key_reset, params)
        state = jax.tree.map(lambda x, y: jax.lax.select(done, x, y), fresh, stepped)
        return self.get_obs(state, params), state, reward, done, jnp.zeros_like(done), info

    def step_env(self, key, state, action, params):
        state, reward, info = self.transition(key, state, action, params)
        return self.get_obs(state, params), state, reward, self.is_terminated(state, params), info

    def reset_env(self, key, params):
        state = self.initial_state(key, params)
        return self.get_obs(state, params), state

    def action_space(self, params=None) -> spaces.Discrete:
        """The space of one agent's action; `step` takes int32 `[num_agents]`, one each."""
        return spaces.Discrete(self.num_actions)


# ---------------------------------------------------------------------------------------------
# Gridworld
# ---------------------------------------------------------------------------------------------

# (dx, dy) per action: 0 stay, 1 +x, 2 -x, 3 +y, 4 -y (WarpDrive's action order)
GRID_MOVES = jnp.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], jnp.int32)


@struct.dataclass
class GridState(environment.EnvState):
    pos: jax.Array      # int32 [num_agents, 2]: (x, y), each in 0 .. grid_length
    active: jax.Array   # bool [num_agents]: still in the game (only the runner ever leaves)
    tags: jax.Array     # int32: tags so far this episode
    time: jax.Array     # int32: steps taken this episode


@struct.dataclass
class GridParams(environment.EnvParams):
    max_steps_in_episode: int = 100     # WarpDrive's episode_length
    # Cells run 0 .. grid_length inclusive on each axis (WarpDrive clips positions to
    # grid_length), so the board has (grid_length + 1)^2 cells.
    grid_length: int = 10
    wall_hit_penalty: float = 0.1       # subtracted when a move runs into the edge
    tag_reward_for_tagger: float = 10.0   # to EVERY tagger on the step the runner is tagged
    tag_penalty_for_runner: float = 2.0   # subtracted from the runner when it is tagged
    step_cost_for_tagger: float = 0.01  # every other step: taggers lose it, the runner gains it
    # False: WarpDrive's fixed start (taggers on the centre cell, the runner in the corner).
    # True: taggers on uniform cells of 1 .. grid_length - 1 per axis, the runner in the corner,
    # drawn at every reset (the starts of WarpDrive's tag_gridworld_with_reset_pool, which picks
    # among 5 such layouts drawn once).
    random_start: bool = False


class TagGridworld(_Tag):
    """Tag on a grid: `num_taggers` taggers and one runner (the last agent).

    Every step each agent moves one cell (or stays); a move off the board leaves the agent at
    the edge and costs `wall_hit_penalty`. After everyone has moved, the runner is tagged if
    any tagger stands on its cell (taggers that swap cells with it do not tag). Then every
    tagger gets `tag_reward_for_tagger` and the runner `-tag_penalty_for_runner`, and the game
    ends (`terminated`); on any other step every tagger gets `-step_cost_for_tagger` and the
    runner `+step_cost_for_tagger`.

    Observations (`use_full_observation`, default True, WarpDrive's default), `[N, 4N + 1]` for
    N agents, agent i: `x / L` of all N agents, `y / L` of all N, the type of all N (1 for the
    runner, 0 for a tagger: WarpDrive's gridworld encoding), one-hot i, `time / episode length`.
    Nearest-neighbour observations (`use_full_observation=False`), `[N, 6]`: own `x / L, y / L`;
    the runner's `x / L, y / L` for a tagger, the nearest tagger's (least squared distance,
    lowest index on ties) for the runner; own type (1 runner); `time / episode length`.

    WarpDrive's gridworld has exactly one runner, and so has this one. The game ends on the
    first tag, so the runner's leaving (`state.active`) only matters if `step_env` is called
    past the end: the runner then stays put, cannot be tagged again and gets reward 0.
    """

    def __init__(self, num_taggers: int = 10, use_full_observation: bool = True):
        super().__init__(num_taggers, 1)
        self.use_full_observation = use_full_observation
        self.obs_dim = 4 * self.num_agents + 1 if use_full_observation else 6

    @property
    def default_params(self) -> GridParams:
        return GridParams()

    def transition(self, key: jax.Array, state: GridState, action: jax.Array,
                   params: GridParams) -> tuple[GridState, jax.Array, dict]:
        t = self.num_taggers
        move = GRID_MOVES[action] * state.active[:, None]   # a runner out of the game stays put
        target = state.pos + move
        pos = jnp.clip(target, 0, params.grid_length)
        hit_wall = jnp.any(pos != target, axis=-1)
        tagged = jnp.logical_and(state.active[-1], jnp.any(jnp.all(pos[:t] == pos[-1], axis=-1)))

        tagger_reward = jnp.where(tagged, params.tag_reward_for_tagger, -params.step_cost_for_tagger)
        runner_reward = jnp.where(tagged, -params.tag_penalty_for_runner, params.step_cost_for_tagger)
        runner_reward = jnp.where(state.active[-1], runner_reward, 0.0)
        reward = jnp.concatenate([jnp.full((t,), tagger_reward, jnp.float32),
                                  jnp.reshape(runner_reward, (1,)).astype(jnp.float32)])
        reward = reward - params.wall_hit_penalty * hit_wall.astype(jnp.float32)

        active = state.active.at[-1].set(jnp.logical_and(state.active[-1], jnp.logical_not(tagged)))
        state = GridState(pos=pos, active=active, tags=state.tags + tagged, time=state.time + 1)
        info = {"tags": tagged.astype(jnp.int32), "episode_tags": state.tags, "active": state.active}
        return state, reward, info

    def initial_state(self, key: jax.Array, params: GridParams) -> GridState:
        length = jnp.asarray(params.grid_length, jnp.int32)
        centre = jnp.broadcast_to(length // 2, (self.num_taggers, 2))
        drawn = jax.random.randint(key, (self.num_taggers, 2), 1, length, jnp.int32)
        taggers = jnp.where(params.random_start, drawn, centre)
        pos = jnp.concatenate([taggers, jnp.zeros((1, 2), jnp.int32)])
        return GridState(pos=pos, active=jnp.ones(self.num_agents, bool), tags=jnp.int32(0), time=jnp.int32(0))

    def get_obs(self, state: GridState, params: GridParams | None = None, key=None) -> jax.Array:
        params = self.default_params if params is None else params
        n = self.num_agents
        xy = state.pos.astype(jnp.float32) / jnp.asarray(params.grid_length, jnp.float32)  # [N, 2]
        time = state.time.astype(jnp.float32) / jnp.asarray(params.max_steps_in_episode, jnp.float32)
        types = jnp.asarray(self.team_ids, jnp.float32)   # 1 for the runner, as in WarpDrive
        if self.use_full_observation:
            common = jnp.concatenate([xy[:, 0], xy[:, 1], types])                 # [3N]
            return jnp.concatenate([jnp.broadcast_to(common, (n, 3 * n)), jnp.eye(n, dtype=jnp.float32),
                                    jnp.full((n, 1), time)], axis=-1)
        # The runner watches its nearest tagger; every tagger watches the runner.
        d2 = jnp.sum((state.pos[:self.num_taggers] - state.pos[-1]) ** 2, axis=-1)
        nearest = xy[jnp.argmin(d2)]
        other = jnp.concatenate([jnp.broadcast_to(xy[-1], (self.num_taggers, 2)), nearest[None]])
        return jnp.concatenate([xy, other, types[:, None], jnp.full((n, 1), time)], axis=-1)

    @property
    def name(self) -> str:
        return "TagGridworld-v0"

    @property
    def num_actions(self) -> int:
        return len(GRID_MOVES)

    def observation_space(self, params: GridParams | None = None) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (self.num_agents, self.obs_dim), jnp.float32)


# ---------------------------------------------------------------------------------------------
# Continuous
# ---------------------------------------------------------------------------------------------

# Observations normalise speed and acceleration by max_speed + EPS (WarpDrive's guard against a
# zero max speed).
EPS = 1e-10
NUM_FEATURES = 7   # per observed agent: dx, dy, d speed, d acceleration, d direction, type, in game


@struct.dataclass
class ContinuousState(environment.EnvState):
    pos: jax.Array           # float32 [num_agents, 2]: (x, y) in [0, grid_length]
    speed: jax.Array         # float32 [num_agents]: in [0, max_speed * skill level]
    direction: jax.Array     # float32 [num_agents]: heading in [0, 2 pi)
    acceleration: jax.Array  # float32 [num_agents]: carried between steps; actions change it
    active: jax.Array        # bool [num_agents]: still in the game (taggers always are)
    tags: jax.Array          # int32: tags so far this episode
    time: jax.Array          # int32: steps taken this episode


@struct.dataclass
class ContinuousParams(environment.EnvParams):
    max_steps_in_episode: int = 100     # WarpDrive's episode_length
    grid_length: float = 10.0           # the world is the square [0, grid_length]^2
    max_speed: float = 1.0
    skill_level_runner: float = 1.0     # multiplies max_speed for runners
    skill_level_tagger: float = 1.0     # multiplies max_speed for taggers
    max_acceleration: float = 1.0
    min_acceleration: float = -1.0
    max_turn: float = math.pi / 2
    min_turn: float = -math.pi / 2
    edge_hit_penalty: float = -0.0      # added (so <= 0) on a step that ends past an edge
    # A runner is tagged when its nearest tagger is closer than tagging_distance * grid_length.
    tagging_distance: float = 0.01
    tag_reward_for_tagger: float = 1.0  # to the tagged runner's nearest tagger, per runner
    step_penalty_for_tagger: float = -0.0   # added to every tagger every step (<= 0)
    tag_penalty_for_runner: float = -1.0    # added to a runner when it is tagged (<= 0)
    step_reward_for_runner: float = 0.0     # added to every runner in the game every step
    end_of_game_reward_for_runner: float = 1.0   # to every runner still in the game at the limit
    # True: a tagged runner leaves the game (WarpDrive's default). False: it plays on and can be
    # tagged again on later steps, and the game only ends at the time limit.
    runner_exits_game_after_tagged: bool = True


class TagContinuous(_Tag):
    """Tag on the continuous square `[0, L]^2`: `num_taggers` taggers, `num_runners` runners.

    Action: one index per agent, `acc * (num_turn_levels + 1) + turn` (WarpDrive's
    MultiDiscrete pair, flattened; `split_action` undoes it). Acceleration level `acc` picks from
    `[0, linspace(min_acceleration, max_acceleration, num_acceleration_levels)]`, turn level
    `turn` from `[0, linspace(min_turn, max_turn, num_turn_levels)]`; index 0 of each is the
    no-op, so action 0 keeps course.

    Movement of an agent in the game, every step:
        acceleration += chosen acceleration
        direction = (direction + chosen turn) mod 2 pi
        speed = clip(speed + acceleration, 0, max_speed * skill level)
        acceleration = 0 where speed reached 0 or max_speed * skill level
        position += speed * (cos direction, sin direction), clipped into the square; ending past
            an edge adds `edge_hit_penalty` to the agent's reward.
    An agent out of the game has speed, heading and acceleration 0 and does not move.

    Tags (after the moves), for every runner in the game: its nearest tagger (lowest index on
    ties) tags it when closer than `tagging_distance * grid_length`. The runner gets
    `tag_penalty_for_runner`, that tagger `tag_reward_for_tagger` (a tagger collects one reward
    per runner it tags). Every agent in the game at the start of the step also gets the edge
    penalty and its team's step reward (`step_penalty_for_tagger` / `step_reward_for_runner`).
    At the time limit every runner still in the game gets `end_of_game_reward_for_runner`.
    A runner out of the game gets reward 0. The game ends (`terminated`) when no runner is left.

    Observations, all relative to the observer i and normalised: for each observed agent j the
    features `(x_j - x_i) / (sqrt 2 L)`, `(y_j - y_i) / (sqrt 2 L)`, `(speed_j - speed_i) /
    max_speed`, `(acceleration_j - acceleration_i) / max_speed`, `(direction_j - direction_i) /
    2 pi`, type of j (1 for a TAGGER, 0 for a runner: WarpDrive's continuous encoding, the
    opposite of `team_ids`), j in the game (0/1), laid out feature by feature (all agents'
    first feature, then all agents' second, ...), then `time / episode length`.
    - `use_full_observation=True` (WarpDrive's default): every other agent, in index order,
      `[N, 7 (N - 1) + 1]`. For an observer out of the game the five relative features and the
      time are 0 (type and in-game flags stay, as in WarpDrive).
    - `use_full_observation=False`: the `num_other_agents_observed` (K) nearest other agents
      still in the game, nearest first (lowest index on ties), `[N, 7 K + 1]`; slots beyond the
      agents left are 0, and an observer out of the game sees all zeros.
    """

    def __init__(self, num_taggers: int = 1, num_runners: int = 10, use_full_observation: bool = True,
                 num_other_agents_observed: int = 2, num_acceleration_levels: int = 10, num_turn_levels: int = 10):
        super().__init__(num_taggers, num_runners)
        if not use_full_observation and not 1 <= num_other_agents_observed <= self.num_agents - 1:
            raise ValueError(f"num_other_agents_observed must be in 1 .. {self.num_agents - 1} "
                             f"(the other agents), got {num_other_agents_observed}")
        if num_acceleration_levels < 0 or num_turn_levels < 0:
            raise ValueError("the numbers of acceleration and turn levels must be >= 0")
        self.use_full_observation = use_full_observation
        self.num_other_agents_observed = num_other_agents_observed
        self.num_acceleration_levels = num_acceleration_levels
        self.num_turn_levels = num_turn_levels
        # An action is a pair of choices (WarpDrive's MultiDiscrete), flattened: a policy may
        # choose each from its own head (algos/mappo/mappo.py).
        self.action_factors = (num_acceleration_levels + 1, num_turn_levels + 1)
        self.num_observed = self.num_agents - 1 if use_full_observation else num_other_agents_observed
        self.obs_dim = NUM_FEATURES * self.num_observed + 1
        # [N, N - 1]: the other agents of each agent, in index order (the full observation)
        self._others = np.array([[j for j in range(self.num_agents) if j != i] for i in range(self.num_agents)],
                                np.int32).reshape(self.num_agents, self.num_agents - 1)
        self._is_tagger = self.team_ids == TAGGER

    @property
    def default_params(self) -> ContinuousParams:
        return ContinuousParams()

    def split_action(self, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(acceleration level, turn level) of flat action indices."""
        return action // (self.num_turn_levels + 1), action % (self.num_turn_levels + 1)

    def transition(self, key: jax.Array, state: ContinuousState, action: jax.Array,
                   params: ContinuousParams) -> tuple[ContinuousState, jax.Array, dict]:
        t = self.num_taggers
        alive = state.active.astype(jnp.float32)
        acc_level, turn_level = self.split_action(action)
        acc_table = jnp.concatenate([jnp.zeros(1, jnp.float32), jnp.linspace(
            params.min_acceleration, params.max_acceleration, self.num_acceleration_levels, dtype=jnp.float32)])
        turn_table = jnp.concatenate([jnp.zeros(1, jnp.float32), jnp.linspace(
            params.min_turn, params.max_turn, self.num_turn_levels, dtype=jnp.float32)])

        top_speed = params.max_speed * jnp.where(self._is_tagger, params.skill_level_tagger,
                                                 params.skill_level_runner).astype(jnp.float32)
        acceleration = state.acceleration + acc_table[acc_level]
        direction = jnp.mod(state.direction + turn_table[turn_level], TWO_PI) * alive
        # float32 rounding can land a tiny negative angle on 2 pi itself; keep it in [0, 2 pi)
        direction = jnp.where(direction >= TWO_PI, direction - TWO_PI, direction)
        speed = jnp.clip(state.speed + acceleration, 0.0, top_speed) * alive
        # A speed pinned at a bound drops the built-up acceleration.
        acceleration = jnp.where((speed <= 0.0) | (speed >= top_speed), 0.0, acceleration)
        heading = jnp.stack([jnp.cos(direction), jnp.sin(direction)], axis=-1)
        moved = state.pos + speed[:, None] * heading
        length = jnp.asarray(params.grid_length, jnp.float32)
        crossed = jnp.any((moved < 0.0) | (moved > length), axis=-1)
        pos = jnp.clip(moved, 0.0, length)

        # Tags: each runner against its nearest tagger, [runners, taggers] distances.
        dist = jnp.sqrt(jnp.sum((pos[t:, None, :] - pos[None, :t, :]) ** 2, axis=-1))
        nearest = jnp.argmin(dist, axis=-1)
        runner_in = state.active[t:]
        tagged = runner_in & (jnp.min(dist, axis=-1) < params.tagging_distance * length)
        tag_count = jnp.sum(jax.nn.one_hot(nearest, t, dtype=jnp.float32) * tagged[:, None], axis=0)  # [T]

        step_reward = jnp.where(self._is_tagger, params.step_penalty_for_tagger,
                                params.step_reward_for_runner).astype(jnp.float32)
        reward = alive * (jnp.where(crossed, params.edge_hit_penalty, 0.0) + step_reward)
        runner_left = tagged & params.runner_exits_game_after_tagged
        runner_active = runner_in & jnp.logical_not(runner_left)
        time = state.time + 1
        at_limit = time >= params.max_steps_in_episode
        runner_reward = (jnp.where(tagged, params.tag_penalty_for_runner, 0.0)
                         + jnp.where(at_limit & runner_active, params.end_of_game_reward_for_runner, 0.0))
        reward = reward + jnp.concatenate([tag_count * params.tag_reward_for_tagger, runner_reward])

        state = ContinuousState(pos=pos, speed=speed, direction=direction, acceleration=acceleration,
                                active=jnp.concatenate([state.active[:t], runner_active]),
                                tags=state.tags + jnp.sum(tagged, dtype=jnp.int32), time=time)
        info = {"tags": jnp.sum(tagged, dtype=jnp.int32), "episode_tags": state.tags, "active": state.active}
        return state, reward.astype(jnp.float32), info

    def initial_state(self, key: jax.Array, params: ContinuousParams) -> ContinuousState:
        key_pos, key_dir = jax.random.split(key)
        n = self.num_agents
        pos = jax.random.uniform(key_pos, (n, 2), jnp.float32) * jnp.asarray(params.grid_length, jnp.float32)
        # Headings start on one of the four axis directions, as in WarpDrive.
        direction = jax.random.randint(key_dir, (n,), 0, 4).astype(jnp.float32) * jnp.float32(math.pi / 2)
        zeros = jnp.zeros(n, jnp.float32)
        return ContinuousState(pos=pos, speed=zeros, direction=direction, acceleration=zeros,
                               active=jnp.ones(n, bool), tags=jnp.int32(0), time=jnp.int32(0))

    def get_obs(self, state: ContinuousState, params: ContinuousParams | None = None, key=None) -> jax.Array:
        params = self.default_params if params is None else params
        n = self.num_agents
        diagonal = jnp.float32(math.sqrt(2.0)) * jnp.asarray(params.grid_length, jnp.float32)
        speed_scale = jnp.asarray(params.max_speed, jnp.float32) + EPS
        feats = jnp.stack([state.pos[:, 0] / diagonal, state.pos[:, 1] / diagonal, state.speed / speed_scale,
                           state.acceleration / speed_scale, state.direction / TWO_PI])   # [5, N]
        observer_in = state.active.astype(jnp.float32)[:, None]                         # [N, 1]
        time = (state.time.astype(jnp.float32)
                / jnp.asarray(params.max_steps_in_episode, jnp.float32)) * observer_in    # [N, 1]
        if self.use_full_observation:
            seen = jnp.asarray(self._others)                                            # [N, N - 1]
            shown = observer_in                     # type and in-game flags stay for a dropped observer
            seen_mask = observer_in
        else:
            seen, shown = self._nearest(state)
            seen_mask = shown
        rel = (feats[:, seen] - feats[:, :, None]) * seen_mask[None]                   # [5, N, K]
        rel = jnp.transpose(rel, (1, 0, 2)).reshape(n, 5 * self.num_observed)
        types = jnp.asarray(self._is_tagger, jnp.float32)[seen]
        in_game = state.active.astype(jnp.float32)[seen]
        if not self.use_full_observation:
            types, in_game = types * shown, in_game * shown
        return jnp.concatenate([rel, types, in_game, time], axis=-1)

    def _nearest(self, state: ContinuousState) -> tuple[jax.Array, jax.Array]:
        """Indices `[N, K]` of each agent's K nearest others in the game, nearest first, and a
        float mask `[N, K]` of the slots that hold one (0 past the agents left, and everywhere
        for an observer out of the game).

        K passes of argmin over the `[N, N]` distances, each taking the nearest agent after the
        last one found in (distance, index) order, so ties go to the lower index. Each pass is one
        read of the distances. `lax.top_k` (a sort per row on GPUs) is slower, the more so the
        more agents (measurements: experiments/RESULTS.md); passes that rewrite the distances to
        hide each found agent are no faster than these."""
        n = self.num_agents
        d2 = jnp.sum((state.pos[:, None, :] - state.pos[None, :, :]) ** 2, axis=-1)     # [N, N]
        hidden = jnp.eye(n, dtype=bool) | jnp.logical_not(state.active)[None, :]
        d2 = jnp.where(hidden, jnp.inf, d2)
        cols = jnp.arange(n, dtype=jnp.int32)
        rows = jnp.arange(n)
        last_d, last_j = jnp.full((n,), -1.0, jnp.float32), jnp.full((n,), -1, jnp.int32)
        seen, found = [], []

        def after(d, j):  # (d, j) comes after the row's last found (distance, index)
            return (d > last_d[:, None]) | ((d == last_d[:, None]) & (j > last_j[:, None]))

        for _ in range(self.num_other_agents_observed):
            j = jnp.argmin(jnp.where(after(d2, cols[None, :]), d2, jnp.inf), axis=-1).astype(jnp.int32)
            d = d2[rows, j]
            # a row with no agent left after the last one gives index 0: its slot is not shown
            d = jnp.where(after(d[:, None], j[:, None])[:, 0], d, jnp.inf)
            seen.append(j)
            found.append(d)
            last_d, last_j = d, j
        shown = jnp.isfinite(jnp.stack(found, -1)) & state.active[:, None]
        return jnp.stack(seen, -1), shown.astype(jnp.float32)

    @property
    def name(self) -> str:
        return "TagContinuous-v0"

    @property
    def num_actions(self) -> int:
        return (self.num_acceleration_levels + 1) * (self.num_turn_levels + 1)

    def observation_space(self, params: ContinuousParams | None = None) -> spaces.Box:
        return spaces.Box(-jnp.inf, jnp.inf, (self.num_agents, self.obs_dim), jnp.float32)


# ---------------------------------------------------------------------------------------------
# Factories
# ---------------------------------------------------------------------------------------------

def make_gridworld(num_taggers: int = 10, num_runners: int = 1, grid_length: int = 10, episode_length: int = 100,
                   use_full_observation: bool = True, **params: Any) -> tuple[TagGridworld, GridParams]:
    """`(env, params)` of a gridworld with WarpDrive's defaults; `params` are further
    `GridParams` fields (wall_hit_penalty, tag_reward_for_tagger, ...)."""
    if num_runners != 1:
        raise ValueError(f"num_runners must be 1: the gridworld has exactly one runner (WarpDrive's), got {num_runners}")
    env = TagGridworld(num_taggers, use_full_observation)
    return env, GridParams(max_steps_in_episode=episode_length, grid_length=grid_length, **params)


def make_continuous(num_taggers: int = 1, num_runners: int = 10, grid_length: float = 10.0,
                    episode_length: int = 100, use_full_observation: bool = True, num_other_agents_observed: int = 2,
                    num_acceleration_levels: int = 10, num_turn_levels: int = 10,
                    **params: Any) -> tuple[TagContinuous, ContinuousParams]:
    """`(env, params)` of a continuous game with WarpDrive's defaults; `params` are further
    `ContinuousParams` fields (max_speed, tagging_distance, tag_reward_for_tagger, ...)."""
    env = TagContinuous(num_taggers, num_runners, use_full_observation, num_other_agents_observed,
                        num_acceleration_levels, num_turn_levels)
    return env, ContinuousParams(max_steps_in_episode=episode_length, grid_length=grid_length, **params)


ENVS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "TagGridworld-v0": make_gridworld,
    "TagContinuous-v0": make_continuous,
}

# What each factory takes from `--env-args` (envs.make checks it there, before anything is
# built): its named parameters, then the EnvParams fields it passes on. Sizes must be positive
# (a board of length 0 divides observations by 0); rewards and angles may have either sign.
# Relations between arguments are the factories' and the environments' own checks.
ARGS: dict[str, dict[str, Arg]] = {
    "TagGridworld-v0": dict(
        num_taggers=COUNT, num_runners=COUNT, grid_length=COUNT, episode_length=COUNT, use_full_observation=FLAG,
        wall_hit_penalty=REAL, tag_reward_for_tagger=REAL, tag_penalty_for_runner=REAL, step_cost_for_tagger=REAL,
        random_start=FLAG),
    "TagContinuous-v0": dict(
        num_taggers=COUNT, num_runners=COUNT, grid_length=POSITIVE, episode_length=COUNT, use_full_observation=FLAG,
        num_other_agents_observed=COUNT,
        # 0 levels leaves only the no-op of that choice (the agents cannot accelerate, or turn)
        num_acceleration_levels=Arg(int, at_least=0), num_turn_levels=Arg(int, at_least=0),
        max_speed=POSITIVE, skill_level_runner=POSITIVE, skill_level_tagger=POSITIVE,
        max_acceleration=REAL, min_acceleration=REAL, max_turn=REAL, min_turn=REAL,
        edge_hit_penalty=REAL, tagging_distance=POSITIVE, tag_reward_for_tagger=REAL, step_penalty_for_tagger=REAL,
        tag_penalty_for_runner=REAL, step_reward_for_runner=REAL, end_of_game_reward_for_runner=REAL,
        runner_exits_game_after_tagged=FLAG),
}

# WarpDrive's training run configs: `env` is the yaml's env section as factory arguments
# (`make_gridworld(**RUN_CONFIG_SIZES["TagGridworld-v0"]["env"])`; its seed is left out, the
# keys passed in replace it), `num_envs` and `train_batch_size` its trainer section (a training
# batch is num_envs x (train_batch_size / num_envs) steps, per agent).
RUN_CONFIG_SIZES: dict[str, dict[str, Any]] = {
    # warp_drive/training/run_configs/tag_gridworld.yaml (use_full_observation: the default, True)
    "TagGridworld-v0": dict(
        num_envs=2000, train_batch_size=200_000,
        env=dict(num_taggers=4, grid_length=100, episode_length=100, wall_hit_penalty=0.1,
                 tag_reward_for_tagger=10.0, tag_penalty_for_runner=5.0, step_cost_for_tagger=0.01)),
    # warp_drive/training/run_configs/tag_continuous.yaml
    "TagContinuous-v0": dict(
        num_envs=100, train_batch_size=25_000,
        env=dict(num_taggers=10, num_runners=100, grid_length=20.0, episode_length=500,
                 use_full_observation=False, num_other_agents_observed=10,
                 num_acceleration_levels=20, num_turn_levels=20,
                 max_acceleration=0.1, min_acceleration=-0.1, max_turn=2.356, min_turn=-2.356,
                 skill_level_runner=1.0, skill_level_tagger=1.0, max_speed=1.0,
                 runner_exits_game_after_tagged=True, tag_reward_for_tagger=10.0,
                 tag_penalty_for_runner=-10.0, step_penalty_for_tagger=0.0, step_reward_for_runner=0.0,
                 edge_hit_penalty=0.0, end_of_game_reward_for_runner=1.0, tagging_distance=0.02)),
}

for _name, _factory in ENVS.items():
    register(_name, _factory, ARGS[_name])
