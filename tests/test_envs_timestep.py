"""The suites behind `--env SUITE:TASK` that envs/old_gymnax.py (Craftax) and envs/timestep.py
(Jumanji, XLand-MiniGrid, Navix) adapt: each adapter against its suite's own reset and step
(observations, rewards, how episodes end, auto-reset), the registry's errors, and a few PPO
updates on each suite, with evaluation and an exact resume on one."""

import json
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# CI installs every extra (.ci/run); a machine without one skips this file.
for _package in ("craftax", "jumanji", "navix", "xminigrid"):
    pytest.importorskip(_package)

import jumanji  # noqa: E402
import navix  # noqa: E402
import xminigrid  # noqa: E402
from craftax.craftax_classic.constants import BlockType  # noqa: E402
from jumanji import specs  # noqa: E402

from jaxrl_mgpu import config as config_lib  # noqa: E402
from jaxrl_mgpu import envs, evaluate  # noqa: E402
from jaxrl_mgpu.algos.dqn import dqn
from jaxrl_mgpu.algos.ppo import ppo  # noqa: E402
from jaxrl_mgpu.envs import timestep  # noqa: E402

from helpers import assert_resume_is_exact, resolved, rows, run  # noqa: E402


# -- the adapters against their suites ---------------------------------------------------------

class Reference(NamedTuple):
    """A suite driven through its own API, as its users call it."""
    reset: Callable[[jax.Array], tuple[Any, Any]]          # key -> (carry, observation)
    # (carry, action, key) -> (carry, observation, reward, last, absorbing)
    step: Callable[[Any, jax.Array, jax.Array], tuple[Any, Any, jax.Array, jax.Array, jax.Array]]


def flat(observation) -> jax.Array:
    """The documented layout: every leaf raveled, concatenated."""
    return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(observation)])


def side_by_side(env, ref: Reference):
    """A jitted `(params, state, ref_carry, limit, keys, actions) -> record` that steps the
    adapter (`env.step`: auto-reset and all) and the suite's own step through `actions`, each from
    its own state, and records both. The suite's episodes end at its own last step or after
    `limit` steps, and are reset by hand from the half of the step key gymnax's step resets with."""
    @jax.jit
    def run_both(params, state, ref_carry, limit, keys, actions):
        def step(carry, xs):
            state, ref_carry, t = carry
            key, action = xs
            obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
            key_step, key_reset = jax.random.split(key)
            ref_carry, ref_obs, ref_reward, last, absorbing = ref.step(ref_carry, action, key_step)
            t = t + 1
            ended = last | (t >= limit)
            reset_carry, reset_obs = ref.reset(key_reset)
            ref_carry = jax.tree.map(lambda r, s: jnp.where(ended, r, s), reset_carry, ref_carry)
            record = dict(obs=obs, final=info["final_observation"], reward=reward, terminated=terminated,
                          truncated=truncated, ref_obs=flat(ref_obs), ref_reset_obs=flat(reset_obs),
                          ref_reward=jnp.asarray(ref_reward, jnp.float32), ref_terminated=last & absorbing,
                          ref_truncated=ended & ~(last & absorbing))
            return (state, ref_carry, jnp.where(ended, 0, t)), record

        return jax.lax.scan(step, (state, ref_carry, jnp.int32(0)), (keys, actions))[1]

    return run_both


def check_record(record, ends: str) -> dict:
    """Asserts the adapter's record matches the suite's, step by step; returns it as numpy."""
    r = jax.tree.map(np.asarray, record)
    ended = r["ref_terminated"] | r["ref_truncated"]
    np.testing.assert_array_equal(r["reward"], r["ref_reward"])
    np.testing.assert_array_equal(r["terminated"], r["ref_terminated"])
    np.testing.assert_array_equal(r["truncated"], r["ref_truncated"])
    np.testing.assert_array_equal(r["final"], r["ref_obs"])   # what the step led to, before any reset
    np.testing.assert_array_equal(r["obs"][ended], r["ref_reset_obs"][ended])   # then a new episode
    np.testing.assert_array_equal(r["obs"][~ended], r["ref_obs"][~ended])
    assert not (r["terminated"] & r["truncated"]).any()
    for kind in ends.split():
        assert r[kind].any(), f"the script should end an episode by {kind}"
    return r


def compare(env, params, ref: Reference, key, actions, limit: int, ends: str) -> dict:
    """Same key, same first observation; then `check_record` over the script `actions`."""
    obs, state = env.reset(key, params)
    ref_carry, ref_obs = ref.reset(key)
    np.testing.assert_array_equal(obs, flat(ref_obs))
    assert obs.dtype == jnp.float32 and obs.shape == env.observation_space(params).shape
    keys = jax.random.split(jax.random.PRNGKey(7), len(actions))
    record = side_by_side(env, ref)(params, state, ref_carry, limit, keys, jnp.asarray(actions, jnp.int32))
    return check_record(record, ends)


def dm_env_reference(reset, step) -> Reference:
    def ref_step(carry, action, key):
        carry, ts = step(carry, action)
        return carry, ts.observation, ts.reward, ts.step_type == 2, ts.discount == 0
    return Reference(reset, ref_step)


def random_actions(n: int, steps: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, steps)


@pytest.mark.slow
def test_jumanji_snake_matches_the_suite_and_ends_terminated():
    env, params = envs.make("jumanji:Snake-v1")
    suite = jumanji.make("Snake-v1")
    ref = dm_env_reference(lambda k: (lambda s, ts: (s, ts.observation))(*suite.reset(k)), suite.step)
    # Up, 15 times: the snake hits the top wall within 12 steps (a true end, discount 0); then random play.
    actions = np.concatenate([np.zeros(15, int), random_actions(4, 100)])
    r = compare(env, params, ref, jax.random.PRNGKey(0), actions, 10**6, "terminated")
    assert r["terminated"][:12].any()
    # The documented order: the fields of the NamedTuple as declared (grid, step_count, action_mask).
    _, ts = suite.reset(jax.random.PRNGKey(0))
    obs, _ = env.reset(jax.random.PRNGKey(0), params)
    grid = ts.observation.grid.size
    np.testing.assert_array_equal(obs[:grid], ts.observation.grid.ravel())
    assert obs[grid] == ts.observation.step_count and (obs[grid + 1:] == ts.observation.action_mask).all()
    assert params.max_steps_in_episode == suite.time_limit == 4000 and env.action_space(params).n == 4


@pytest.mark.slow
def test_jumanji_ends_its_time_limit_with_discount_0_so_it_is_terminated():
    """Snake observes its step count and ends its limit with a termination (discount 0)."""
    suite = jumanji.make("Snake-v1", time_limit=5)
    env = timestep.JumanjiEnv("jumanji:Snake-v1", suite, 4, timestep.Params(max_steps_in_episode=5))
    ref = dm_env_reference(lambda k: (lambda s, ts: (s, ts.observation))(*suite.reset(k)), suite.step)
    turns = np.array([1, 3] * 6)   # right, left, ...: a snake of length 1 turns back without biting itself
    r = compare(env, env.default_params, ref, jax.random.PRNGKey(1), turns, 10**6, "terminated")
    assert r["terminated"][[4, 9]].all() and not r["truncated"].any()


@pytest.mark.slow
def test_the_adapters_own_step_limit_truncates():
    """Game2048 has no limit of its own; the adapter cuts episodes at params.max_steps_in_episode."""
    env, params = envs.make("jumanji:Game2048-v1")
    assert params.max_steps_in_episode == timestep.GAME_2048_STEPS
    suite = jumanji.make("Game2048-v1")
    ref = dm_env_reference(lambda k: (lambda s, ts: (s, ts.observation))(*suite.reset(k)), suite.step)
    short = params.replace(max_steps_in_episode=6)
    r = compare(env, short, ref, jax.random.PRNGKey(2), random_actions(4, 20), 6, "truncated")
    assert r["truncated"][[5, 11, 17]].all()


def navix_reference(suite) -> Reference:
    def ref_step(carry, action, key):
        ts = suite.step(carry, action)
        return ts, ts.observation, ts.reward, ts.step_type > 0, ts.step_type == 2
    return Reference(lambda k: (lambda ts: (ts, ts.observation))(suite.reset(k)), ref_step)


@pytest.mark.slow
def test_navix_matches_the_suite_truncates_at_its_limit_and_terminates_at_the_goal():
    env, params = envs.make("navix:Navix-Empty-5x5-v0")
    suite = navix.make("Navix-Empty-5x5-v0")
    assert params.max_steps_in_episode == suite.max_steps and env.observation_space(params).shape == (5 * 5 * 3,)
    # Turning on the spot until the time limit (truncated, with the last observation kept), then
    # forward, forward, turn right, forward, forward: the goal (terminated, reward 1).
    limit = suite.max_steps
    actions = np.concatenate([np.zeros(limit, int), [2, 2, 1, 2, 2], random_actions(7, 20)])
    r = compare(env, params, navix_reference(suite), jax.random.PRNGKey(0), actions, 10**6,
                "truncated terminated")
    assert r["truncated"][limit - 1] and r["terminated"][limit + 4] and r["reward"][limit + 4] > 0


@pytest.mark.slow
def test_xminigrid_matches_the_suite_and_truncates_at_its_limit():
    env, params = envs.make("xminigrid:MiniGrid-Empty-5x5")
    suite, suite_params = xminigrid.make("MiniGrid-Empty-5x5")
    ref = dm_env_reference(lambda k: (lambda ts: (ts, ts.observation))(suite.reset(suite_params, k)),
                           lambda ts, a: (lambda t: (t, t))(suite.step(suite_params, ts, a)))
    limit = suite_params.max_steps
    # Turning on the spot until the time limit (discount 1 on the last step: truncated), then
    # into the goal: from the top-left corner facing right, forward twice, turn right, forward twice.
    actions = np.concatenate([np.full(limit, 1), [0, 0, 1, 0, 0], random_actions(6, 20)])
    r = compare(env, params, ref, jax.random.PRNGKey(0), actions, 10**6, "truncated terminated")
    assert r["truncated"][limit - 1] and r["terminated"][limit + 4] and r["reward"][limit + 4] > 0


def craftax_steps(env, params, state, actions, key):
    """Steps the adapter's `step_env` (what gymnax's `step` wraps in its auto-reset) and Craftax's
    own `step` side by side, eagerly: each call of Craftax's jitted step is one compiled program,
    where a scan of the adapter's whole step would compile Craftax twice more. Where the suite
    says `done`, both restart from the suite's reset. Returns (terminated, truncated) per step."""
    suite, suite_params = env.suite_env, params.suite.replace(max_timesteps=params.max_steps_in_episode)
    ref_state, ends = state, []
    for t, action in enumerate(actions):
        step_key = jax.random.fold_in(key, t)
        obs, state, reward, terminated, info = env.step_env(step_key, state, action, params)
        truncated = env.is_truncated(state, params)
        ref_obs, ref_state, ref_reward, done, _ = suite.step(step_key, ref_state, action, suite_params)
        # the episode metrics: the achievements (in percent) of an episode at the step that ends it
        achieved = [info[name] for name in env.episode_metrics if name.startswith("Achievements/")]
        np.testing.assert_array_equal(achieved, ref_state.achievements * 100.0 * done)
        x, y = ref_state.player_position
        dies = (ref_state.player_health <= 0) | (ref_state.map[x, y] == BlockType.LAVA.value)
        np.testing.assert_array_equal(obs, ref_obs)
        assert reward == ref_reward and bool(terminated) == bool(done & dies) and bool(truncated) == bool(done & ~dies)
        ends.append((bool(terminated), bool(truncated)))
        if done:
            _, ref_state = suite.reset(jax.random.fold_in(key, 1000 + t), suite_params)
            state = ref_state
    return np.array(ends)


@pytest.mark.slow
def test_craftax_matches_the_suite_truncates_at_its_limit_and_a_death_is_terminated():
    env, params = envs.make("craftax:Craftax-Classic-Symbolic-v1")
    assert params.max_steps_in_episode == 10_000 and env.action_space(params).n == 17
    assert env.observation_space(params).shape == (1345,)
    key = jax.random.PRNGKey(0)
    obs, state = env.reset_env(key, params)   # same key, same observation
    np.testing.assert_array_equal(obs, env.suite_env.reset(key, params.suite)[0])
    # random play: a limit of 5 steps ends episodes after 5 steps, by truncation
    short = params.replace(max_steps_in_episode=5)
    ends = craftax_steps(env, short, state, random_actions(17, 10), key)
    assert ends[[4, 9], 1].all() and ends.sum() == 2
    # the block under the player turned to lava: the next step dies (terminated) ...
    x, y = state.player_position
    lava = state.replace(map=state.map.at[x, y].set(BlockType.LAVA.value))
    ends = craftax_steps(env, short, lava, np.zeros(7, int), key)
    assert ends[0, 0] and ends[5, 1] and ends.sum() == 2
    # ... also on the last step of the time limit
    ends = craftax_steps(env, params.replace(max_steps_in_episode=1), lava, np.zeros(1, int), key)
    assert ends.tolist() == [[True, False]]


def test_a_craftax_rollout_is_not_unrolled_on_a_gpu(monkeypatch):
    from jaxrl_mgpu.algos.ppo import ppo
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert ppo.rollout_unroll(envs.make("craftax:Craftax-Classic-Symbolic-v1")[0]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("task, metrics", [("Craftax-Classic-Symbolic-v1", 22 + 1), ("Craftax-Symbolic-v1", 67)])
def test_craftax_reports_its_achievements_per_episode(task, metrics):
    env, params = envs.make(f"craftax:{task}")
    assert len(env.episode_metrics) == metrics and "Achievements/collect_wood" in env.episode_metrics
    envs.check_env_step(f"craftax:{task}", env, params)  # the interface, and each metric one number in the info


# -- the registry ------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_jumanji_tasks_offered_are_those_of_one_discrete_choice():
    """The table of refused tasks against the suite: every registered task is offered or refused,
    every offered one takes one discrete choice, and a few refused ones (quick to make; the
    others build their generators for seconds) do not."""
    offered, registered = set(envs.registry._SUITES["jumanji"].tasks()), set(jumanji.registered_environments())
    refused = {task for task in registered if envs.registry._SUITES["jumanji"].refuse(task)}
    assert offered == registered - refused and len(offered) == 9
    for task in sorted(offered) + ["Minesweeper-v0", "RubiksCube-v0", "SearchAndRescue-v0"]:
        assert isinstance(jumanji.make(task).action_spec, specs.DiscreteArray) == (task in offered), task


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
@pytest.mark.parametrize("env, args, words", [
    ("craftax:Nope", None, "--env craftax:Nope: no such task; craftax offers Craftax-Classic-Symbolic-v1, "
                           "Craftax-Classic-Pixels-v1, Craftax-Symbolic-v1, Craftax-Pixels-v1"),
    ("jumanji:Snake-v9", None, "--env jumanji:Snake-v9: no such task; jumanji offers CVRP-v1, Game2048-v1,"),
    ("navix:Empty-8x8", None, "--env navix:Empty-8x8: no such task; navix offers Navix-"),
    ("xminigrid:MiniGrid-Empty-7x7", None, "no such task; xminigrid offers MiniGrid-BlockedUnlockPickUp,"),
    ("xminigrid:XLand-MiniGrid-R1-9x9", None, "--env xminigrid:XLand-MiniGrid-R1-9x9 is not supported: "
                                              "XLand-MiniGrid's rulesets come from its benchmarks, which it downloads"),
    ("jumanji:BinPack-v2", None, "--env jumanji:BinPack-v2 is not supported: its action is several discrete choices "
                                 "at once (a MultiDiscreteArray); the policies here take one discrete choice"),
    ("jumanji:SearchAndRescue-v0", None, "is not supported: its action is continuous"),
    ("jumanji:Sokoban-v0", None, "is not supported: it downloads its levels"),
    ("craftax:Craftax-Classic-Symbolic-AutoReset-v1", None, "use craftax:Craftax-Classic-Symbolic-v1"),
    ("jumanji:Snake-v1", "time_limit=10", "--env-args time_limit=10: jumanji:Snake-v1 takes no arguments"),
    ("navix:Navix-Empty-8x8-v0", "max_steps=10", "navix:Navix-Empty-8x8-v0 takes no arguments"),
])
def test_a_bad_suite_task_is_one_line_and_writes_nothing(env, args, words, algo, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--algo", algo, "--env", env, "--run-dir", str(run_dir)] + (["--env-args", args] if args else [])
    assert run(*argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    if "no such task" in words:   # the tasks listed are those offered
        assert "BinPack" not in err[0] and "XLand-" not in err[0] and "AutoReset" not in err[0]
    assert not run_dir.exists()


@pytest.mark.parametrize("task", ["craftax:Craftax-Classic-Symbolic-v1", "jumanji:Snake-v1",
                                  "navix:Navix-Empty-8x8-v0", "xminigrid:MiniGrid-EmptyRandom-8x8"])
def test_ppo_and_dqn_take_the_discrete_tasks(task):
    for algo in (ppo, dqn):
        cfg = config_lib.validate(config_lib.build(dict(env=task, algo=algo.__name__.split(".")[-1],
                                                      num_envs=16)))
        algo.check(resolved(cfg), 8)


# -- training ----------------------------------------------------------------------------------

TINY = ["--num-envs", "16", "--num-steps", "8", "--num-minibatches", "2", "--update-epochs", "1", "--hidden-size", "16",
        "--log-every", "2", "--checkpoint-every", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["craftax:Craftax-Classic-Symbolic-v1", "jumanji:Snake-v1",
                                  "xminigrid:MiniGrid-EmptyRandom-8x8"])
def test_a_few_ppo_updates_on_each_suite(task, tmp_path):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--env", task, "--total-timesteps", str(16 * 8 * 2), "--run-dir", str(run_dir)) == 0
    assert [r["update"] for r in rows(run_dir)] == [2]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "complete"


@pytest.mark.slow
def test_navix_stop_and_resume_equals_an_uninterrupted_run_and_evaluates(tmp_path, capsys):
    task = ["--env", "navix:Navix-Empty-5x5-v0", "--total-timesteps", str(16 * 8 * 4)]
    straight, _ = assert_resume_is_exact(tmp_path, [*TINY, *task], stop_at=2, end=4)
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(straight), "--episodes", "8"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 8 and result["step"] == 4 and np.isfinite(result["mean_return"])
