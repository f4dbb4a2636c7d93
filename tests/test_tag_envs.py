"""The two Tag games (envs/tag.py): bounds, the tag rule, rewards, episode ends, runners that
leave the game, observations, jit/vmap and gymnax's auto-reset.

Compiling dominates these tests, so they share a few environments and jitted helpers (jax
caches a compiled step per environment object and params structure)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mgpu.envs import tag

KEY = jax.random.PRNGKey(0)
GRID = tag.TagGridworld(num_taggers=4)                                  # full observations
GRID_NEAR = tag.TagGridworld(num_taggers=2, use_full_observation=False)
CONT = tag.TagContinuous(num_taggers=2, num_runners=2)                  # full observations, 11 x 11 actions
CONT_NEAR = tag.TagContinuous(num_taggers=1, num_runners=3, use_full_observation=False, num_other_agents_observed=3)
NOOP_GRID = jnp.zeros(GRID.num_agents, jnp.int32)
NOOP = jnp.zeros(4, jnp.int32)   # both continuous games have 4 agents; action 0 keeps course


@functools.partial(jax.jit, static_argnums=0)
@functools.partial(jax.jit, static_argnums=0)
def step_env(env, state, action, params):
    """One transition without gymnax's auto-reset (to look at the state it ends in)."""
    return env.step_env(KEY, state, action, params)


@functools.partial(jax.jit, static_argnums=0)
def step(env, key, state, action, params):
    """gymnax's auto-resetting step, compiled (run eagerly, its many small ops dispatch one by one)."""
    return env.step(key, state, action, params)


@functools.partial(jax.jit, static_argnums=0)
def get_obs(env, state, params):
    return env.get_obs(state, params)


def grid_state(pos, active=None, time=0):
    pos = jnp.asarray(pos, jnp.int32)
    active = jnp.ones(len(pos), bool) if active is None else jnp.asarray(active)
    return tag.GridState(pos=pos, active=active, tags=jnp.int32(0), time=jnp.int32(time))


def cont_state(pos, speed=None, direction=None, acceleration=None, active=None, time=0):
    pos = jnp.asarray(pos, jnp.float32)
    zeros = jnp.zeros(len(pos), jnp.float32)
    as_f32 = lambda x: zeros if x is None else jnp.asarray(x, jnp.float32)  # noqa: E731
    return tag.ContinuousState(pos=pos, speed=as_f32(speed), direction=as_f32(direction),
                               acceleration=as_f32(acceleration),
                               active=jnp.ones(len(pos), bool) if active is None else jnp.asarray(active),
                               tags=jnp.int32(0), time=jnp.int32(time))


def rollout(env, params, num_envs, steps, seed=0):
    """Random actions in `num_envs` games through the auto-resetting `env.step` (jit + vmap);
    returns the states `[steps, num_envs, ...]`, rewards, terminated, truncated and infos."""
    keys = jax.random.split(jax.random.PRNGKey(seed), num_envs)

    def one(state, key):
        k_act, k_step = jax.random.split(key)
        action = jax.random.randint(k_act, (num_envs, env.num_agents), 0, env.num_actions)
        _, state, reward, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(k_step, num_envs), state, action, params)
        return state, (state, reward, terminated, truncated, info)

    def run(keys):
        _, state = jax.vmap(env.reset, (0, None))(keys, params)
        return jax.lax.scan(one, state, jax.random.split(jax.random.PRNGKey(seed + 1), steps))[1]

    return jax.jit(run)(keys)


def test_layout_teams_and_shapes():
    env, params = tag.make_continuous(num_taggers=2, num_runners=3, use_full_observation=False,
                                      num_other_agents_observed=3, num_acceleration_levels=2, num_turn_levels=4)
    np.testing.assert_array_equal(env.team_ids, [0, 0, 1, 1, 1])
    assert (env.num_taggers, env.num_runners, env.num_agents) == (2, 3, 5)
    assert env.num_actions == 3 * 5 and env.obs_dim == 7 * 3 + 1
    assert env.observation_space(params).shape == (5, 22) and env.action_space(params).n == 15
    acc, turn = env.split_action(jnp.arange(15))
    np.testing.assert_array_equal(acc, np.repeat([0, 1, 2], 5))
    np.testing.assert_array_equal(turn, np.tile(np.arange(5), 3))

    np.testing.assert_array_equal(GRID.team_ids, [0, 0, 0, 0, 1])
    assert GRID.obs_dim == 4 * 5 + 1 and GRID.num_actions == 5 and GRID_NEAR.obs_dim == 6
    with pytest.raises(ValueError, match="one runner"):
        tag.make_gridworld(num_runners=2)
    with pytest.raises(ValueError, match="num_other_agents_observed"):
        tag.make_continuous(num_taggers=1, num_runners=2, use_full_observation=False, num_other_agents_observed=3)


def test_defaults_and_run_configs():
    """WarpDrive's constructor defaults, and its two run configs' sizes."""
    env, params = tag.ENVS["TagContinuous-v0"]()
    assert (env.num_taggers, env.num_runners, env.num_other_agents_observed) == (1, 10, 2)
    assert env.use_full_observation
    assert env.num_actions == 11 * 11 and env.obs_dim == 7 * 10 + 1
    assert (params.max_steps_in_episode, params.grid_length, params.tagging_distance,
            params.tag_reward_for_tagger, params.tag_penalty_for_runner) == (100, 10.0, 0.01, 1.0, -1.0)
    grid, gparams = tag.ENVS["TagGridworld-v0"]()
    assert grid.num_taggers == 10 and grid.obs_dim == 4 * 11 + 1
    assert (gparams.grid_length, gparams.max_steps_in_episode, gparams.tag_penalty_for_runner) == (10, 100, 2.0)

    cfg = tag.RUN_CONFIG_SIZES["TagContinuous-v0"]
    env, params = tag.make_continuous(**cfg["env"])
    assert cfg["num_envs"] == 100 and env.num_agents == 110 and env.num_actions == 21 * 21
    assert env.obs_dim == 7 * 10 + 1 and params.max_steps_in_episode == 500 and params.tagging_distance == 0.02
    cfg = tag.RUN_CONFIG_SIZES["TagGridworld-v0"]
    grid, gparams = tag.make_gridworld(**cfg["env"])
    assert cfg["num_envs"] == 2000 and grid.num_agents == 5 and gparams.grid_length == 100
    assert gparams.tag_penalty_for_runner == 5.0


# ---------------------------------------------------------------------------------------------
# Gridworld
# ---------------------------------------------------------------------------------------------

def test_gridworld_stays_on_board_and_games_end_by_tags():
    params = tag.GridParams(grid_length=3, max_steps_in_episode=30, random_start=True)
    states, reward, terminated, truncated, info = rollout(GRID, params, num_envs=16, steps=200)
    pos = np.asarray(states.pos)
    assert pos.min() == 0 and pos.max() == 3, "agents reach both edges and never pass them"
    # every tag ends its game at once, and only a tag or the time limit does; no truncation
    at_limit = np.asarray(info["tags"]) == 0
    assert (np.asarray(terminated)[np.asarray(info["tags"]) == 1]).all() and not np.asarray(truncated).any()
    assert np.asarray(terminated)[at_limit].sum() > 0
    allowed = np.array([-0.11, -0.01, 9.9, 10.0,      # taggers: step cost or tag, maybe a wall
                        0.01, -0.09, -2.0, -2.1])     # the runner
    assert np.abs(np.asarray(reward)[..., None] - allowed).min(-1).max() < 1e-5


def test_gridworld_tag_on_the_same_cell():
    """WarpDrive's own unit case: four taggers on (0, 0), the runner on (1, 1)."""
    params = tag.GridParams(grid_length=4, max_steps_in_episode=10)
    state = grid_state([[0, 0]] * 4 + [[1, 1]])
    # tagger 0 walks into the wall (-x), 1 stays, 2 goes +y onto (0, 1), 3 walks into the wall
    # (-y); the runner goes -x onto (0, 1): tagged.
    obs, new, reward, terminated, info = step_env(GRID, state, jnp.array([2, 0, 3, 4, 2]), params)
    np.testing.assert_allclose(reward, [9.9, 10.0, 10.0, 9.9, -2.0], rtol=1e-6)
    assert bool(terminated) and int(info["tags"]) == 1
    np.testing.assert_array_equal(new.active, [True, True, True, True, False])
    np.testing.assert_array_equal(new.pos, [[0, 0], [0, 0], [0, 1], [0, 0], [0, 1]])

    # tagger 2 stays: nobody on the runner's cell, step costs only
    obs, new, reward, terminated, info = step_env(GRID, state, jnp.array([2, 0, 0, 4, 2]), params)
    np.testing.assert_allclose(reward, [-0.11, -0.01, -0.01, -0.11, 0.01], rtol=1e-6)
    assert not bool(terminated) and int(info["tags"]) == 0 and bool(new.active[-1])


def test_gridworld_neighbouring_cells_and_swaps_do_not_tag():
    params = GRID.default_params
    state = grid_state([[2, 2], [9, 9], [9, 9], [9, 9], [3, 2]])   # tagger 0 next to the runner
    _, _, reward, terminated, info = step_env(GRID, state, NOOP_GRID, params)
    assert not bool(terminated) and int(info["tags"]) == 0
    np.testing.assert_allclose(reward, [-0.01] * 4 + [0.01], rtol=1e-6)
    # they swap cells: only the cells after the moves count
    _, new, _, terminated, _ = step_env(GRID, state, jnp.array([1, 0, 0, 0, 2]), params)
    np.testing.assert_array_equal(np.asarray(new.pos)[[0, 4]], [[3, 2], [2, 2]])
    assert not bool(terminated)
    # the tagger steps onto the runner: every tagger is paid
    _, _, reward, terminated, _ = step_env(GRID, state, jnp.array([1, 0, 0, 0, 0]), params)
    assert bool(terminated)
    np.testing.assert_allclose(reward, [10.0] * 4 + [-2.0])


def test_gridworld_observations():
    params = tag.GridParams(grid_length=10, max_steps_in_episode=20)
    state = grid_state([[1, 2], [7, 8], [0, 0], [10, 10], [3, 3]], time=5)
    full = np.asarray(get_obs(GRID, state, params))
    assert full.shape == (5, 21)
    for i in range(5):
        np.testing.assert_allclose(full[i], [0.1, 0.7, 0.0, 1.0, 0.3,       # x / L of all
                                             0.2, 0.8, 0.0, 1.0, 0.3,       # y / L of all
                                             0, 0, 0, 0, 1,                 # types: the runner is 1
                                             *np.eye(5)[i], 0.25], rtol=1e-6)
    state = grid_state([[1, 2], [7, 8], [3, 3]], time=5)         # taggers 0, 1; runner 2
    near = np.asarray(get_obs(GRID_NEAR, state, params))
    np.testing.assert_allclose(near, [[0.1, 0.2, 0.3, 0.3, 0, 0.25],       # taggers see the runner
                                      [0.7, 0.8, 0.3, 0.3, 0, 0.25],
                                      [0.3, 0.3, 0.1, 0.2, 1, 0.25]],      # the runner its nearest tagger
                               rtol=1e-6)


@pytest.mark.slow
def test_gridworld_start_and_step_limit():
    params = tag.GridParams(grid_length=10, max_steps_in_episode=7)
    obs, state = GRID.reset(KEY, params)
    np.testing.assert_array_equal(state.pos, [[5, 5]] * 4 + [[0, 0]])
    for t in range(1, 8):
        key = jax.random.fold_in(KEY, t)
        obs, state, reward, terminated, truncated, info = step(GRID, key, state, NOOP_GRID, params)
        assert bool(terminated) == (t == 7) and not bool(truncated)
    assert int(state.time) == 0, "the game was reset after its last step"
    assert float(obs[0, -1]) == 0.0 and "final_observation" not in info

    # random starts: taggers inside 1 .. grid_length - 1, the runner in the corner
    random = params.replace(random_start=True)
    starts = np.asarray(jax.vmap(GRID.reset, (0, None))(jax.random.split(KEY, 64), random)[1].pos)
    assert starts[:, :4].min() == 1 and starts[:, :4].max() == 9 and (starts[:, 4] == 0).all()


# ---------------------------------------------------------------------------------------------
# Continuous
# ---------------------------------------------------------------------------------------------

def test_continuous_stays_in_bounds():
    params = tag.ContinuousParams(grid_length=2.0, max_steps_in_episode=50, skill_level_tagger=1.5,
                                  edge_hit_penalty=-0.5)
    states, reward, terminated, truncated, info = rollout(CONT_NEAR, params, num_envs=8, steps=150)
    pos, speed, direction = (np.asarray(x) for x in (states.pos, states.speed, states.direction))
    assert pos.min() == 0.0 and pos.max() == 2.0, "agents reach the edges and never pass them"
    top = np.where(CONT_NEAR.team_ids == tag.TAGGER, 1.5, 1.0)
    assert (speed >= 0).all() and (speed <= top + 1e-6).all() and speed.max() > 1.0
    assert (direction >= 0).all() and (direction < np.float32(2 * math.pi)).all()
    assert np.asarray(terminated).sum() > 0 and (np.asarray(reward) < -0.4).any()   # edge penalties happen


def test_continuous_tag_within_tagging_distance_only():
    params = CONT.default_params.replace(tagging_distance=0.1, tag_reward_for_tagger=3.0,
                                         tag_penalty_for_runner=-2.0, step_penalty_for_tagger=-0.1,
                                         step_reward_for_runner=0.05)
    # margin 0.1 * 10 = 1: runner 2 is 0.99 from tagger 0, runner 3 is 1.01 from tagger 1
    state = cont_state([[5.0, 5.0], [2.0, 3.01], [5.99, 5.0], [2.0, 2.0]])
    _, new, reward, terminated, info = step_env(CONT, state, NOOP, params)
    np.testing.assert_allclose(reward, [3.0 - 0.1, -0.1, -2.0 + 0.05, 0.05], rtol=1e-6)
    np.testing.assert_array_equal(new.active, [True, True, False, True])
    assert int(info["tags"]) == 1 and not bool(terminated)


def test_continuous_nearest_tagger_collects_one_reward_per_runner():
    params = CONT.default_params.replace(tagging_distance=0.1)   # margin 1
    # both runners are within reach of both taggers; tagger 1 is the nearer one for both
    state = cont_state([[5.0, 5.0], [5.5, 5.0], [5.9, 5.0], [5.5, 5.4]])
    _, new, reward, terminated, info = step_env(CONT, state, NOOP, params)
    np.testing.assert_allclose(reward, [0.0, 2.0, -1.0, -1.0])
    assert int(info["tags"]) == 2 and bool(terminated), "no runner left: the game is over"


def test_continuous_tagged_runner_stays_out():
    params = CONT_NEAR.default_params.replace(tagging_distance=0.05, step_reward_for_runner=0.1,
                                              max_steps_in_episode=4, edge_hit_penalty=-1.0)
    # runner 1 is within reach (0.2 < 0.5); runners 2 and 3 are far
    state = cont_state([[5.0, 5.0], [5.2, 5.0], [1.0, 1.0], [9.0, 8.0]])
    _, state, reward, _, info = step_env(CONT_NEAR, state, NOOP, params)
    assert int(info["tags"]) == 1 and not bool(state.active[1])
    frozen = np.asarray(state.pos[1])
    # the dropped runner asks for full acceleration and a turn every step; the game runs to its limit
    action = jnp.array([0, 10 * 11 + 10, 0, 0], jnp.int32)
    diag = math.sqrt(2) * 10
    for t in range(2, 5):
        obs, state, reward, terminated, info = step_env(CONT_NEAR, state, action, params)
        np.testing.assert_array_equal(state.pos[1], frozen)
        assert float(state.speed[1]) == 0.0 and float(reward[1]) == 0.0
        assert int(info["tags"]) == 0 and bool(terminated) == (t == 4)   # the limit ends the game
        np.testing.assert_array_equal(obs[1], 0.0)
        # the tagger sees runners 3 (5 away) then 2 (5.66 away), never the dropped runner
        np.testing.assert_allclose(obs[0, 0:3], [4 / diag, -4 / diag, 0.0], rtol=1e-5)
        np.testing.assert_allclose(obs[0, 3:6], [3 / diag, -4 / diag, 0.0], rtol=1e-5)
        np.testing.assert_array_equal(obs[0, 18:21], [1.0, 1.0, 0.0])
        # and runner 2 sees the tagger and runner 3 only
        np.testing.assert_array_equal(obs[2, 15:21], [1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    assert int(state.time) == 4
    np.testing.assert_allclose(reward, [0.0, 0.0, 1.1, 1.1])   # end-of-game reward to the runners still in


def test_continuous_runners_can_stay_in_the_game():
    params = CONT_NEAR.default_params.replace(tagging_distance=0.1, runner_exits_game_after_tagged=False)
    state = cont_state([[5.0, 5.0], [5.5, 5.0], [1.0, 1.0], [9.0, 9.0]])
    for _ in range(2):
        _, state, reward, terminated, info = step_env(CONT_NEAR, state, NOOP, params)
        assert int(info["tags"]) == 1 and not bool(terminated) and bool(state.active.all())
        np.testing.assert_allclose(reward, [1.0, -1.0, 0.0, 0.0])


@pytest.mark.slow
def test_continuous_game_ends_when_all_runners_are_tagged_and_resets():
    params = CONT_NEAR.default_params.replace(tagging_distance=0.1)
    # runners 1 and 2 are already out (runner 1 stands within reach, but no longer counts);
    # runner 3 is tagged now
    state = cont_state([[5.0, 5.0], [5.5, 5.0], [1.0, 1.0], [5.0, 5.5]], active=[True, False, False, True], time=3)
    obs, new, reward, terminated, truncated, info = step(CONT_NEAR, KEY, state, NOOP, params)
    assert bool(terminated) and not bool(truncated) and int(info["tags"]) == 1
    np.testing.assert_allclose(reward, [1.0, 0.0, 0.0, -1.0])
    assert int(new.time) == 0 and bool(new.active.all()), "auto-reset to a fresh game"
    _, fresh = CONT_NEAR.reset(jax.random.split(KEY)[1], params)
    np.testing.assert_array_equal(new.pos, fresh.pos)
    np.testing.assert_allclose(obs, get_obs(CONT_NEAR, fresh, params), rtol=1e-6)
    # the tagger's last view (step_env, no reset): nobody left to see, at time 4 of 100
    last_obs, *_ = step_env(CONT_NEAR, state, NOOP, params)
    np.testing.assert_allclose(last_obs[0], [0.0] * 21 + [0.04], rtol=1e-6)


def test_continuous_end_of_game_reward_skips_runners_tagged_at_the_end():
    params = CONT_NEAR.default_params.replace(tagging_distance=0.1, max_steps_in_episode=6,
                                              end_of_game_reward_for_runner=0.5)
    state = cont_state([[5.0, 5.0], [5.5, 5.0], [1.0, 1.0], [9.0, 9.0]], active=[True, True, True, False], time=5)
    _, _, reward, terminated, truncated, info = step(CONT_NEAR, KEY, state, NOOP, params)
    assert bool(terminated) and not bool(truncated) and int(info["tags"]) == 1
    np.testing.assert_allclose(reward, [1.0, -1.0, 0.5, 0.0])


def test_continuous_movement():
    # 10 acceleration levels in [-0.45, 0.45] and 10 turn levels in [-0.9, 0.9], 0.1 and 0.2
    # apart; level 0 is the no-op, so level 10 is the top and level 1 the bottom of each range.
    params = CONT.default_params.replace(max_acceleration=0.45, min_acceleration=-0.45, max_turn=0.9,
                                         min_turn=-0.9, skill_level_tagger=2.0, grid_length=100.0)
    state = cont_state([[50.0, 50.0], [10.0, 10.0], [20.0, 20.0], [80.0, 80.0]],
                       speed=[0.0, 1.9, 0.9, 0.5], direction=[6.0, 0.0, math.pi / 2, 0.0],
                       acceleration=[0.0, 0.5, 0.3, 0.0])
    action = jnp.array([10 * 11 + 10,   # tagger 0: +0.45, turn +0.9 from rest
                        0,              # tagger 1: 1.9 + 0.5 passes its top speed 2 (skill 2)
                        10 * 11,        # runner 2: 0.9 + 0.75 passes its top speed 1
                        1 * 11 + 1],    # runner 3: -0.45, turn -0.9
                       jnp.int32)
    _, new, _, _, _ = step_env(CONT, state, action, params)
    heading0, heading3 = (6.0 + 0.9) % (2 * math.pi), 2 * math.pi - 0.9
    np.testing.assert_allclose(new.direction, [heading0, 0.0, math.pi / 2, heading3], rtol=1e-5)
    np.testing.assert_allclose(new.speed, [0.45, 2.0, 1.0, 0.05], rtol=1e-5)
    # a speed pinned at a bound drops the acceleration; otherwise it is carried
    np.testing.assert_allclose(new.acceleration, [0.45, 0.0, 0.0, -0.45], rtol=1e-5)
    np.testing.assert_allclose(new.pos, [[50 + 0.45 * math.cos(heading0), 50 + 0.45 * math.sin(heading0)],
                                         [12.0, 10.0], [20.0, 21.0],
                                         [80 + 0.05 * math.cos(heading3), 80 + 0.05 * math.sin(heading3)]],
                               rtol=1e-5)
    # a no-op step: tagger 0 keeps accelerating (0.45 + 0.45), runner 3 stops at 0
    _, new, _, _, _ = step_env(CONT, new, NOOP, params)
    np.testing.assert_allclose(new.speed, [0.9, 2.0, 1.0, 0.0], rtol=1e-5)
    np.testing.assert_allclose(new.acceleration, [0.45, 0.0, 0.0, 0.0], rtol=1e-5)


def test_continuous_edge_hit():
    params = CONT_NEAR.default_params.replace(edge_hit_penalty=-0.5, step_reward_for_runner=0.25)
    # runner 1 heads -x at speed 1 from x = 0.3
    state = cont_state([[5.0, 5.0], [0.3, 7.0], [1.0, 1.0], [9.0, 9.0]], speed=[0.0, 1.0, 0.0, 0.0],
                       direction=[0.0, math.pi, 0.0, 0.0])
    _, new, reward, _, _ = step_env(CONT_NEAR, state, NOOP, params)
    np.testing.assert_allclose(new.pos[1], [0.0, 7.0], atol=1e-6)
    np.testing.assert_allclose(reward, [0.0, -0.5 + 0.25, 0.25, 0.25])


def test_continuous_nearest_neighbour_observation():
    params = CONT_NEAR.default_params.replace(max_steps_in_episode=10)
    diag = math.sqrt(2) * 10
    state = cont_state([[5.0, 5.0], [8.0, 5.0], [5.0, 6.0], [1.0, 1.0]], speed=[0.5, 0.0, 0.25, 0.0],
                       direction=[1.0, 0.0, 2.0, 0.0], acceleration=[0.1, 0.0, 0.0, 0.0], time=4)
    obs = np.asarray(get_obs(CONT_NEAR, state, params))
    assert obs.shape == (4, 22)
    # the tagger's neighbours, nearest first: runner 2 (1 away), runner 1 (3), runner 3 (5.66)
    np.testing.assert_allclose(obs[0], [0 / diag, 3 / diag, -4 / diag,       # dx
                                        1 / diag, 0 / diag, -4 / diag,       # dy
                                        -0.25, -0.5, -0.5,                    # d speed
                                        -0.1, -0.1, -0.1,                     # d acceleration
                                        1 / (2 * math.pi), -1 / (2 * math.pi), -1 / (2 * math.pi),  # d direction
                                        0, 0, 0,                              # types: runners
                                        1, 1, 1, 0.4], rtol=1e-5, atol=1e-7)
    # runner 2 sees the tagger first (type 1); with runner 1 out, its last slot is empty
    out = state.replace(active=jnp.array([True, False, True, True]))
    obs = np.asarray(get_obs(CONT_NEAR, out, params))
    np.testing.assert_allclose(obs[2, 0:3], [0 / diag, -4 / diag, 0.0], atol=1e-7)
    np.testing.assert_array_equal(obs[2, 15:21], [1, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(obs[1], 0.0)


def test_continuous_full_observation():
    params = CONT.default_params.replace(max_steps_in_episode=10)
    diag = math.sqrt(2) * 10
    state = cont_state([[1.0, 2.0], [7.0, 7.0], [4.0, 6.0], [2.0, 2.0]], speed=[0.0, 0.0, 0.5, 0.0], time=5,
                       active=[True, True, True, False])
    obs = np.asarray(get_obs(CONT, state, params))
    assert obs.shape == (4, 7 * 3 + 1)
    # runner 2 sees agents 0, 1, 3 in index order, the dropped runner 3 flagged out of the game
    np.testing.assert_allclose(obs[2], [-3 / diag, 3 / diag, -2 / diag,     # dx
                                        -4 / diag, 1 / diag, -4 / diag,     # dy
                                        -0.5, -0.5, -0.5, 0, 0, 0, 0, 0, 0,
                                        1, 1, 0,                            # types: taggers are 1
                                        1, 1, 0, 0.5], rtol=1e-5, atol=1e-7)
    # the dropped runner's own view: relative features and time zeroed, flags kept
    np.testing.assert_array_equal(obs[3], [0] * 15 + [1, 1, 0, 1, 1, 1, 0])


# ---------------------------------------------------------------------------------------------
# Both: jit + vmap against one game at a time
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("which", ["grid", "continuous"])
def test_vmap_matches_one_game_at_a_time(which):
    if which == "grid":
        env, params = GRID, tag.GridParams(grid_length=3, max_steps_in_episode=6, random_start=True)
    else:
        env, params = CONT_NEAR, tag.ContinuousParams(grid_length=3.0, max_steps_in_episode=6, tagging_distance=0.15)
    num_envs, steps = 4, 12
    keys = jax.random.split(jax.random.PRNGKey(7), num_envs)
    obs_b, state_b = jax.jit(jax.vmap(env.reset, (0, None)))(keys, params)
    step_b = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))
    step_one = jax.jit(env.step)
    singles = [env.reset(k, params) for k in keys]
    for e in range(num_envs):
        np.testing.assert_allclose(obs_b[e], singles[e][0], rtol=1e-6)
    ends = tags = 0
    for t in range(steps):
        action = jax.random.randint(jax.random.PRNGKey(100 + t), (num_envs, env.num_agents), 0, env.num_actions)
        step_keys = jax.random.split(jax.random.PRNGKey(200 + t), num_envs)
        obs_b, state_b, rew_b, term_b, trunc_b, info_b = step_b(step_keys, state_b, action, params)
        assert obs_b.shape == (num_envs, env.num_agents, env.obs_dim) and obs_b.dtype == jnp.float32
        assert rew_b.shape == (num_envs, env.num_agents) and term_b.shape == trunc_b.shape == (num_envs,)
        for e in range(num_envs):
            obs, state, rew, term, trunc, info = step_one(step_keys[e], singles[e][1], action[e], params)
            singles[e] = (obs, state)
            np.testing.assert_allclose(obs_b[e], obs, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(rew_b[e], rew, rtol=1e-5, atol=1e-6)
            assert bool(term_b[e]) == bool(term) and bool(trunc_b[e]) == bool(trunc)
            assert int(info_b["tags"][e]) == int(info["tags"])
            np.testing.assert_array_equal(state_b.active[e], state.active)
            ends += bool(term) or bool(trunc)
            tags += int(info["tags"])
    assert ends >= num_envs and tags > 0, "episodes ended (and were reset) along the way, some by tags"
