"""The Brax `State` adapter (envs/brax_state.py) against the suites' own steps, the `brax:` and
`dmc:` suites' errors, and a short PPO run on an MJX task that evaluates and resumes exactly.

MJX programs take seconds to compile on a CPU: each suite's rollouts are compiled once per
module (the fixtures) and every test of it reuses them with other actions and time limits."""

import importlib.util
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxrl_mgpu import envs, evaluate
from jaxrl_mgpu.envs import brax_state

from helpers import assert_resume_is_exact, run

# CI installs the extras (.ci/run); a local run without them skips what needs them.
needs_brax = pytest.mark.skipif(importlib.util.find_spec("brax") is None, reason="the brax extra is not installed")
needs_dmc = pytest.mark.skipif(importlib.util.find_spec("mujoco_playground") is None,
                               reason="the dmc extra is not installed")

STEPS = 24  # steps of every compared rollout


def adapter_rollout(env):
    """jit(key, actions [STEPS, A], params) -> the adapter's first obs and, per step, (obs,
    reward, terminated, truncated, final observation, physics blew up); step t draws its reset
    from fold_in(key, t)."""
    def rollout(key, actions, params):
        first_obs, state = env.reset(key, params)

        def one(state, step):
            t, action = step
            obs, state, reward, terminated, truncated, info = env.step(jax.random.fold_in(key, t), state, action, params)
            return state, (obs, reward, terminated, truncated, info["final_observation"], info["physics_blew_up"])

        return first_obs, lax.scan(one, state, (jnp.arange(STEPS), actions))[1]
    return jax.jit(rollout)


def suite_rollout(suite_env):
    """jit(key, actions) -> the suite's own first obs and, per step, (obs, reward, done): its
    reset and step, no wrapper, no time limit, no reset after done."""
    def rollout(key, actions):
        first = suite_env.reset(key)

        def one(state, action):
            state = suite_env.step(state, action)
            return state, (state.obs, state.reward, state.done)

        return first.obs, lax.scan(one, first, actions)[1]
    return jax.jit(rollout)


class Rollouts:
    def __init__(self, name, args=None):
        self.env, self.params = envs.make(name, args)
        self.ours = adapter_rollout(self.env)
        self.theirs = suite_rollout(self.env.suite_env)
        self.suite_reset = jax.jit(lambda key: self.env.suite_env.reset(key).obs)

    def both(self, key, actions, max_steps=None):
        params = self.params if max_steps is None else self.params.replace(max_steps_in_episode=max_steps)
        ours = jax.tree.map(np.asarray, self.ours(key, actions, params))
        theirs = jax.tree.map(np.asarray, self.theirs(key, actions))
        return ours, theirs


def close(a, b):
    # The same computation compiled inside another program: equal up to float rounding.
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def check_same_until(ours, theirs, end):
    """Steps 0 .. end - 1 give the suite's observations and rewards, and no episode end."""
    (first, (obs, reward, terminated, truncated, final, blew_up)), (their_first, (their_obs, their_reward, _)) = (
        ours, theirs)
    close(first, their_first)
    close(obs[:end], their_obs[:end])
    close(final[:end], their_obs[:end])
    close(reward[:end], their_reward[:end])
    assert not terminated[:end].any() and not truncated[:end].any() and not blew_up.any()
    assert obs.dtype == np.float32 and obs.shape[1:] == first.shape


def check_next_start(rollouts, key, ours, t):
    """Step t ended an episode: the next observation is a reset's, from step t's key with
    fresh_reset, else the environment's first (from the rollout's key)."""
    obs = ours[1][0]
    start_key = jax.random.fold_in(key, t) if rollouts.env.fresh_reset else key
    close(obs[t], np.asarray(rollouts.suite_reset(start_key)))


@pytest.fixture(scope="module")
def pendulum():
    # a new start every episode here; dmc:CartpoleBalance's test checks the default (one start)
    return Rollouts("brax:inverted_pendulum", "fresh_reset=true")


@pytest.mark.slow
@needs_brax
def test_brax_steps_as_brax_and_terminates_where_it_says_done(pendulum):
    env, key = pendulum.env, jax.random.PRNGKey(3)
    assert env.suite_env.backend == "mjx"  # Brax's trainer's default
    assert pendulum.params.max_steps_in_episode == 1000
    assert env.observation_space(pendulum.params).shape == (4,)
    space = env.action_space(pendulum.params)
    assert space.shape == (1,) and float(space.low) == -1.0 and float(space.high) == 1.0
    # pushing one way the whole time: the pole falls within a few steps
    ours, theirs = pendulum.both(key, jnp.ones((STEPS, 1)))
    done = theirs[1][2]
    assert done.any(), "the pendulum should have fallen"
    end = int(np.argmax(done > 0))
    assert 0 < end < STEPS - 1
    check_same_until(ours, theirs, end)
    _, (obs, reward, terminated, truncated, final, _) = ours
    assert terminated[end] and not truncated[end]
    close(final[end], theirs[1][0][end])  # the observation the episode ended on
    close(reward[end], theirs[1][1][end])
    check_next_start(pendulum, key, ours, end)
    assert not terminated[end + 1]


@pytest.mark.slow
@needs_brax
def test_brax_truncates_exactly_at_the_time_limit(pendulum):
    key = jax.random.PRNGKey(4)
    actions = 0.05 * jax.random.uniform(jax.random.PRNGKey(5), (STEPS, 1), minval=-1.0, maxval=1.0)
    ours, theirs = pendulum.both(key, actions, max_steps=5)
    assert not theirs[1][2][:5].any()
    check_same_until(ours, theirs, 4)
    _, (obs, reward, terminated, truncated, final, _) = ours
    assert truncated.nonzero()[0].tolist() == [4, 9, 14, 19] and not terminated.any()
    close(final[4], theirs[1][0][4])
    check_next_start(pendulum, key, ours, 4)


@pytest.mark.slow
@needs_dmc
def test_dmc_steps_as_playground_and_truncates():
    cartpole = Rollouts("dmc:CartpoleBalance")
    assert cartpole.env.suite_env.mjx_model.impl.value == "jax"
    assert cartpole.params.max_steps_in_episode == 1000  # the task's own episode_length
    assert not cartpole.env.fresh_reset  # the default: every episode from the first start
    key = jax.random.PRNGKey(6)
    actions = jax.random.uniform(jax.random.PRNGKey(7), (STEPS, 1), minval=-1.0, maxval=1.0)
    ours, theirs = cartpole.both(key, actions)
    check_same_until(ours, theirs, STEPS)
    ours, theirs = cartpole.both(key, actions, max_steps=10)
    check_same_until(ours, theirs, 9)
    _, (obs, reward, terminated, truncated, final, _) = ours
    assert truncated.nonzero()[0].tolist() == [9, 19] and not terminated.any()
    close(final[9], theirs[1][0][9])
    close(reward[9], theirs[1][1][9])
    check_next_start(cartpole, key, ours, 9)
    close(ours[1][0][19], ours[0])  # the same start again


@pytest.mark.slow
@needs_brax
def test_action_repeat_and_episode_length_count_the_suites_steps():
    """brax:fast (no physics: it compiles at once): reward = position, never done. With
    action_repeat 3 a step is three of the suite's, rewards summed, and an episode_length of 7
    of the suite's steps is ceil(7 / 3) = 3 steps."""
    env, params = envs.make("brax:fast", "action_repeat=3,episode_length=7")
    assert params.max_steps_in_episode == 3
    key, actions = jax.random.PRNGKey(0), jnp.ones((STEPS, 1))
    ours = jax.tree.map(np.asarray, adapter_rollout(env)(key, actions, params))
    first = env.suite_env.reset(key)
    state, rewards, observations = first, [], []
    for _ in range(9):
        state = env.suite_env.step(state, jnp.ones(1))
        rewards.append(float(state.reward))
        observations.append(np.asarray(state.obs))
    _, (obs, reward, terminated, truncated, final, _) = ours
    close(reward[:3], [sum(rewards[0:3]), sum(rewards[3:6]), sum(rewards[6:9])])
    close(final[:3], [observations[2], observations[5], observations[8]])
    assert truncated.nonzero()[0].tolist() == [2, 5, 8, 11, 14, 17, 20, 23] and not terminated.any()


@needs_brax
def test_physics_that_blows_up_ends_the_episode_with_reward_0_and_nothing_non_finite():
    """brax:fast whose step turns its observation and reward NaN where the action is above 0.5
    (MJX's physics under an extreme contact): that step terminates, with reward 0, a finite
    final observation and the next episode's start; the steps around it are the suite's own."""
    from brax import envs as brax_envs

    class Exploding(brax_envs.Wrapper):
        def step(self, state, action):
            state = self.env.step(state, action)
            bad = action[0] > 0.5
            return state.replace(obs=jnp.where(bad, jnp.nan, state.obs), reward=jnp.where(bad, jnp.nan, state.reward))

    env = brax_state.BraxStateEnv(Exploding(brax_envs.get_environment("fast")), "brax:fast", 1000, 1)
    params = env.default_params
    actions = jnp.zeros((STEPS, 1)).at[5, 0].set(1.0)
    first, (obs, reward, terminated, truncated, final, blew_up) = jax.tree.map(
        np.asarray, adapter_rollout(env)(jax.random.PRNGKey(0), actions, params))
    assert terminated.nonzero()[0].tolist() == [5] and not truncated.any()
    assert blew_up.nonzero()[0].tolist() == [5]  # the episode metric env/physics_blew_up
    assert reward[5] == 0 and np.isfinite(reward).all() and np.isfinite(obs).all() and np.isfinite(final).all()
    np.testing.assert_array_equal(obs[5], first)  # the next episode starts where the first did
    np.testing.assert_array_equal(obs[6:], obs[:STEPS - 6])  # and steps as the first one did


@needs_brax
def test_a_physics_rollout_is_not_unrolled_on_a_gpu(monkeypatch):
    from jaxrl_mgpu.algos.ppo import ppo
    physics, cartpole = envs.make("brax:fast", "")[0], envs.make("CartPole-v1", "")[0]
    assert ppo.rollout_unroll(physics) == ppo.rollout_unroll(cartpole) == 1  # this CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert ppo.rollout_unroll(physics) == 1 and ppo.rollout_unroll(cartpole) == ppo.GPU_ROLLOUT_UNROLL > 1


@needs_brax
def test_a_dict_observation_gives_its_state_entry():
    from brax import envs as brax_envs
    fast = brax_envs.get_environment("fast", obs_mode="dict_state", asymmetric_obs=True)
    env = brax_state.BraxStateEnv(fast, "brax:fast", 10, 1)
    assert env.observation_space(env.default_params).shape == (2,)
    obs, state = env.reset(jax.random.PRNGKey(0), env.default_params)
    assert obs.shape == (2,) and obs.dtype == jnp.float32
    pixels = brax_envs.get_environment("fast", obs_mode="dict_pixels")
    with pytest.raises(envs.EnvError, match="no 'state' entry"):
        brax_state.BraxStateEnv(pixels, "brax:fast", 10, 1)


@pytest.mark.slow
@needs_dmc
def test_the_physics_runs_in_float32_unless_told():
    """MJX's matmuls are traced at "highest" precision (float32; TF32 on a GPU otherwise), the
    suite's reset and step only; `physics_precision=default` leaves them at the backend's."""
    def precisions(args):
        env, params = envs.make("dmc:CartpoleBalance", args)
        _, state = env.reset(jax.random.PRNGKey(0), params)
        jaxprs = (jax.make_jaxpr(env.reset)(jax.random.PRNGKey(0), params),
                  jax.make_jaxpr(env.step)(jax.random.PRNGKey(0), state, jnp.zeros(env.action_size), params))
        # every dot_general's parameters, nested ones (in scans, conds, pjits) too, as the
        # printed jaxpr shows them (a precision of None is not printed)
        found = [p for j in jaxprs for p in re.findall(r"dot_general\[(.*?)\n\s*\]", str(j), re.S)]
        assert len(found) > 10  # MJX's physics multiplies matrices
        return {m.group(1) if (m := re.search(r"precision=(\(.*?\))", p)) else None for p in found}

    assert precisions(None) == {"(Precision.HIGHEST, Precision.HIGHEST)"}
    assert precisions("physics_precision=default") == {None}


@pytest.mark.slow
@pytest.mark.parametrize("argv, words", [
    # only the tasks offered: not swimmer (refused) nor fast (brax's test environment, which the tests use)
    (["--env", "brax:antt"], "--env brax:antt: no such task; brax offers ant, halfcheetah, hopper, humanoid, "
                             "humanoidstandup, inverted_double_pendulum, inverted_pendulum, pusher, reacher, walker2d"),
    (["--env", "brax:swimmer"], "--env brax:swimmer is not supported: brax 0.14.2's swimmer"),
    (["--env", "brax:ant", "--env-args", "episode_length=0"], "brax:ant's episode_length must be at least 1"),
    (["--env", "brax:ant", "--env-args", "action_repeat=1.5"], "brax:ant's action_repeat must be an integer"),
    (["--env", "brax:ant", "--env-args", "backend=warp"],
     "brax:ant's backend must be one of mjx, generalized, positional, spring"),
    (["--env", "brax:ant", "--env-args", "impl=jax"],
     "--env-args impl=jax: brax:ant takes episode_length, action_repeat, fresh_reset, backend"),
    (["--env", "brax:ant", "--env-args", "fresh_reset=1"], "brax:ant's fresh_reset must be true or false"),
    (["--env", "brax:ant", "--env-args", "physics_precision=tf32"],
     "brax:ant's physics_precision must be one of highest, default"),
    (["--env", "brax:inverted_pendulum", "--algo", "dqn"],
     "--algo dqn takes discrete actions (one Q-value each); --env brax:inverted_pendulum has continuous (Box) actions"),
    (["--env", "brax:ant", "--policy", "transformer"], "--env brax:ant has continuous (Box) actions: use --policy mlp"),
])
@needs_brax
def test_a_bad_brax_task_is_one_line_and_writes_nothing(argv, words, tmp_path, capsys):
    check_one_line_error(argv, words, tmp_path, capsys)


@pytest.mark.parametrize("argv, words", [
    (["--env", "dmc:CartpoleBalanc"], "--env dmc:CartpoleBalanc: no such task; dmc offers AcrobotSwingup, "),
    (["--env", "dmc:Go1JoystickFlatTerrain"],
     "--env dmc:Go1JoystickFlatTerrain is not supported: Go1JoystickFlatTerrain is a MuJoCo Playground locomotion task: "
     "it clones a repository of robot models (mujoco_menagerie) from GitHub on first use"),
    (["--env", "dmc:PandaPickCube"], "PandaPickCube is a MuJoCo Playground manipulation task"),
    (["--env", "dmc:CartpoleBalance", "--env-args", "backend=mjx"],
     "--env-args backend=mjx: dmc:CartpoleBalance takes episode_length, action_repeat, fresh_reset"),
    (["--env", "dmc:CartpoleBalance", "--algo", "dqn"], "--env dmc:CartpoleBalance has continuous (Box) actions"),
])
@needs_dmc
def test_a_bad_dmc_task_is_one_line_and_writes_nothing(argv, words, tmp_path, capsys):
    check_one_line_error(argv, words, tmp_path, capsys)


def check_one_line_error(argv, words, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*argv, "--run-dir", str(run_dir)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert words in err[0], (words, err[0])
    assert not run_dir.exists()


@pytest.mark.parametrize("name, package, extra", [("brax:ant", "brax", "brax"),
                                                   ("dmc:CartpoleBalance", "mujoco_playground", "dmc")])
def test_a_missing_extra_is_one_line_with_the_pip_command(name, package, extra, monkeypatch, tmp_path, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda module, *a: None if module == package else find_spec(module, *a))
    check_one_line_error(["--env", name], f"error: --env {name} needs {package}: pip install -e \".[{extra}]\"",
                         tmp_path, capsys)


# 16 envs x 16 steps, 6 updates in chunks of 2, checkpoints every 2 (tests/test_checkpoint.py's TINY)
TINY = ["--env", "brax:inverted_pendulum", "--num-envs", "16", "--num-steps", "16", "--num-minibatches", "2",
        "--hidden-size", "16", "--total-timesteps", str(16 * 16 * 6), "--log-every", "2", "--checkpoint-every", "2"]


@pytest.mark.slow
@needs_brax
def test_ppo_on_an_mjx_task_trains_evaluates_and_resumes_exactly(tmp_path, capsys):
    straight, _ = assert_resume_is_exact(tmp_path, TINY, stop_at=2, end=6)
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(straight), "--episodes", "8"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 8 and result["step"] == 6 and result["mean_return"] >= 1.0
