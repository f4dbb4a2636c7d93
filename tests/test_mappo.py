"""Multi-agent PPO (algos/mappo.py) on the Tag games, on 8 virtual CPU devices: the
device-count contract, the per-agent episode ends, the run's life (train, resume, evaluate
against random teams) and the refusals."""

import json

import jax
import numpy as np
import pytest

from jaxrl_mgpu import evaluate
from jaxrl_mgpu.algos.mappo import mappo

from helpers import assert_resume_is_exact, assert_trees_close, make_trainer, run

# Small games: 2 taggers and 3 runners that see their 2 nearest others, on a 3 x 3 square
# where tags are frequent, 12-step episodes.
CONTINUOUS = dict(env="TagContinuous-v0", env_args="num_taggers=2,num_runners=3,grid_length=3.0,episode_length=12,"
                  "use_full_observation=false,num_other_agents_observed=2,num_acceleration_levels=2,"
                  "num_turn_levels=2,tagging_distance=0.2")
GRID = dict(env="TagGridworld-v0", env_args="num_taggers=2,grid_length=4,episode_length=10,random_start=true")
SMALL = dict(num_envs=16, num_steps=12, update_epochs=2, hidden_size=16, total_timesteps=16 * 12 * 8)


def run_updates(trainer, n: int):
    state = trainer.init_state()
    return trainer.chunk_fn(n, state)(state)


@pytest.mark.slow
@pytest.mark.parametrize("game", [CONTINUOUS, GRID], ids=["continuous", "gridworld"])
def test_one_update_on_8_devices_equals_1_device(game):
    # One minibatch: each team's advantage moments, its count of agents in the game and the
    # averaged gradient all span the global batch, however the games are split.
    one = make_trainer(1, num_minibatches=1, **game, **SMALL)
    eight = make_trainer(8, num_minibatches=1, **game, **SMALL)
    (state1, chunk1), (state8, chunk8) = run_updates(one, 2), run_updates(eight, 2)
    assert set(state1.params) == {"taggers", "runners"}
    assert_trees_close(one.par.first(state1.params), eight.par.first(state8.params), rtol=2e-5, atol=2e-6)
    assert_trees_close(one.par.first(chunk1), eight.par.first(chunk8), rtol=2e-5, atol=2e-6)
    init = one.par.first(one.init_state().params)
    for team in ("taggers", "runners"):  # both teams learned (the comparison is not trivially true)
        moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), init[team], one.par.first(state1.params)[team])
        assert max(jax.tree.leaves(moved)) > 1e-4


@pytest.mark.slow
def test_a_tagged_runner_ends_its_episode_and_leaves_the_loss():
    trainer = make_trainer(2, num_minibatches=2, **CONTINUOUS, **SMALL)
    state = trainer.init_state()
    algo = trainer.algorithm.parts
    traj, mask = trainer.par.map(lambda s: algo.rollout(s.params, s.envs, s.key)[1:3])(state)
    traj, mask = trainer.par.local((traj, mask))  # [devices, T, E, agents]
    terminated, truncated, mask = (np.asarray(x) for x in (traj.terminated, traj.truncated, mask))
    runners = slice(2, 5)
    assert (mask[..., :2] == 1).all()  # taggers never leave
    left = (mask[:, :-1, :, runners] == 1) & (mask[:, 1:, :, runners] == 0)  # in at t, out at t + 1
    assert left.any(), "no runner was tagged: the test game is too large"
    # The step a runner leaves is terminal for it, and nothing after it counts in the same game.
    assert (terminated[:, :-1, :, runners][left] == 1).all()
    game_over = terminated[..., :2].max(-1) == 1
    for d, t, e, r in zip(*np.nonzero(left)):
        later = slice(t + 1, t + 1 + np.argmax(game_over[d, t + 1:, e]) if game_over[d, t + 1:, e].any() else None)
        assert (mask[d, later, e, 2 + r] == 0).all() or game_over[d, t, e]
    assert ((terminated + truncated) <= 1).all()


@pytest.mark.slow
def test_train_resume_and_evaluate_against_random_teams(tmp_path, capsys):
    args = ["--env", CONTINUOUS["env"], "--env-args", CONTINUOUS["env_args"], "--num-envs", "16", "--num-steps", "12",
            "--num-minibatches", "2", "--hidden-size", "16", "--total-timesteps", str(16 * 12 * 6),
            "--log-every", "2", "--checkpoint-every", "2"]
    straight, _ = assert_resume_is_exact(tmp_path, args, stop_at=2, end=6, rows_equal=False, close=(2e-5, 2e-6))
    row = json.loads((straight / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("taggers/episode_return", "runners/episode_return", "tags_per_episode", "episode_length",
                "taggers/loss/policy", "runners/loss/value", "agent_sps"):
        assert row[key] is not None, key
    assert row["agent_sps"] == pytest.approx(5 * row["sps"])
    capsys.readouterr()

    assert evaluate.main(["--run-dir", str(straight), "--episodes", "24"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["taggers"], r["runners"]) for r in lines] == [
        ("trained", "trained"), ("trained", "random"), ("random", "trained"), ("random", "random")]
    for r in lines:
        assert r["episodes"] == 24 and 0 < r["episode_length"] <= 12
        assert 0 <= r["runners/steps_in_game"] <= r["episode_length"] == pytest.approx(r["taggers/steps_in_game"])
        assert 0 <= r["tags_per_episode"] <= 3


@pytest.mark.slow
def test_match_random_teams_act_uniformly():
    # Random against random: the networks' outputs must not matter. Params of two very
    # different inits give the same games.
    trainer = make_trainer(1, **GRID, **SMALL)
    policy, env, env_params = trainer.algorithm.parts.policy, trainer.env, trainer.env_params
    match = trainer.par.map(mappo.make_match(policy, env, env_params, 16, 1, False, ("taggers", "runners")))
    key = trainer.key(3)
    a = match(trainer.par.replicate(policy.init_params(jax.random.PRNGKey(0))), key)
    b = match(trainer.par.replicate(policy.init_params(jax.random.PRNGKey(1))), key)
    assert_trees_close(trainer.par.first(a), trainer.par.first(b), rtol=0, atol=0)
    trained = trainer.par.map(mappo.make_match(policy, env, env_params, 16, 1, True))(
        trainer.par.replicate(policy.init_params(jax.random.PRNGKey(0))), key)
    assert float(trainer.par.first(trained)["games"]) == 16


@pytest.mark.parametrize("extra, message", [
    (["--algo", "dqn"], "multi-agent game"),
    (["--policy", "transformer"], "multi-agent game"),
    (["--normalize-reward"], "multi-agent game"),
    (["--env-args", "num_taggers=0"], "num_taggers must be at least 1"),
    (["--env-args", "speed=2"], "TagContinuous-v0 takes num_taggers, num_runners"),
    (["--env-args", "num_taggers"], "not NAME=VALUE"),
    (["--env", "CartPole-v1", "--env-args", "a=1"], "takes no arguments"),
])
def test_bad_multi_agent_input_is_one_line(extra, message, tmp_path, capsys):
    argv = ["--env", "TagContinuous-v0", "--run-dir", str(tmp_path / "r"), *extra]
    assert run(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_factored_actions_sample_each_choice_from_its_own_head():
    dist = mappo.Factored((3, 4))   # flat action = first * 4 + second
    p1, p2 = np.array([0.2, 0.3, 0.5]), np.array([0.1, 0.2, 0.3, 0.4])
    logits = np.log(np.concatenate([p1, p2])).astype(np.float32)
    joint = np.outer(p1, p2).ravel()
    n = 100_000
    u = jax.random.uniform(jax.random.PRNGKey(0), (n, 2))
    actions = np.asarray(dist.sample(np.broadcast_to(logits, (n, 7)), u))
    np.testing.assert_allclose(np.bincount(actions, minlength=12) / n, joint, atol=0.005)
    np.testing.assert_allclose(np.exp(dist.log_prob(np.broadcast_to(logits, (12, 7)), np.arange(12))), joint, rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(logits[None]), [-(joint * np.log(joint)).sum()], rtol=1e-5)
    assert int(dist.mode(logits[None])[0]) == 11
