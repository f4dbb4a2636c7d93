"""`--env-args`: every argument of an own environment is checked at start-up against its
factory's table (envs.register), so a bad one is one line, exit 2, and nothing is written; an
unknown name lists the names the environment takes."""

import dataclasses
import inspect

import jax
import numpy as np
import pytest

from jaxrl_mgpu import envs
from jaxrl_mgpu.envs import tag

from helpers import run

GRID, CONT = "TagGridworld-v0", "TagContinuous-v0"


@pytest.mark.parametrize("env, args, words", [
    # sizes and counts: integers of at least 1
    (GRID, "grid_length=0", "TagGridworld-v0's grid_length must be at least 1"),
    (GRID, "episode_length=-5", "TagGridworld-v0's episode_length must be at least 1"),
    (GRID, "num_taggers=0", "num_taggers must be at least 1"),
    (GRID, "num_taggers=3000000000", "num_taggers must be at most 2147483647"),
    (GRID, "grid_length=2.5", "grid_length must be an integer"),
    (GRID, "grid_length=4.0", "grid_length must be an integer"),
    (GRID, "num_taggers=true", "num_taggers must be an integer"),
    (GRID, "episode_length=abc", "episode_length must be an integer"),
    (GRID, "episode_length=", "episode_length must be an integer"),
    (GRID, "num_runners=2", "num_runners must be 1"),
    (CONT, "episode_length=0", "TagContinuous-v0's episode_length must be at least 1"),
    (CONT, "num_runners=-1", "num_runners must be at least 1"),
    (CONT, "num_other_agents_observed=0", "num_other_agents_observed must be at least 1"),
    (CONT, "use_full_observation=false,num_other_agents_observed=11", "num_other_agents_observed must be in 1 .. 10"),
    (CONT, "num_acceleration_levels=-1", "num_acceleration_levels must be at least 0"),
    (CONT, "num_turn_levels=1.5", "num_turn_levels must be an integer"),
    # lengths, speeds and distances of the continuous game: finite and positive
    (CONT, "grid_length=0", "TagContinuous-v0's grid_length must be greater than 0"),
    (CONT, "grid_length=-1.5", "grid_length must be greater than 0"),
    (CONT, "grid_length=nan", "grid_length must be finite"),
    (CONT, "grid_length=1e39", "grid_length must be finite in float32"),
    (CONT, "max_speed=0", "max_speed must be greater than 0"),
    (CONT, "max_speed=true", "max_speed must be a number"),
    (CONT, "skill_level_runner=-1", "skill_level_runner must be greater than 0"),
    (CONT, "tagging_distance=0.0", "tagging_distance must be greater than 0"),
    (CONT, "tagging_distance=inf", "tagging_distance must be finite"),
    # rewards and angles: finite, either sign
    (GRID, "wall_hit_penalty=nan", "wall_hit_penalty must be finite"),
    (GRID, "tag_reward_for_tagger=-.inf", "tag_reward_for_tagger must be finite"),
    (CONT, "min_turn=nan", "min_turn must be finite"),
    (CONT, "tag_reward_for_tagger=abc", "tag_reward_for_tagger must be a number"),
    # booleans
    (GRID, "use_full_observation=1", "use_full_observation must be true or false"),
    (GRID, "random_start=maybe", "random_start must be true or false"),
    (CONT, "runner_exits_game_after_tagged=0.5", "runner_exits_game_after_tagged must be true or false"),
    # names
    (GRID, "foo=1", "--env-args foo=1: TagGridworld-v0 takes num_taggers, num_runners, grid_length, episode_length,"),
    (GRID, "max_steps_in_episode=5", "TagGridworld-v0 takes num_taggers,"),   # set through episode_length
    (CONT, "speed=2", "TagContinuous-v0 takes num_taggers,"),
    (CONT, "num_taggers=2,num_taggers=3", "num_taggers is given twice"),
    ("DarkRoom", "foo=1", "--env-args foo=1: DarkRoom takes no arguments"),
    ("CartPole-NoVel-v1", "x=0", "CartPole-NoVel-v1 takes no arguments"),
])
def test_a_bad_env_argument_is_one_line_and_writes_nothing(env, args, words, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run("--env", env, "--env-args", args, "--run-dir", str(run_dir)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --env-args "), err
    assert words in err[0], (words, err[0])
    assert not run_dir.exists()


@pytest.mark.parametrize("name", [GRID, CONT])
def test_an_unknown_name_lists_every_argument(name):
    with pytest.raises(envs.EnvError) as e:
        envs.make(name, "nope=1")
    for arg in tag.ARGS[name]:
        assert arg in str(e.value)


@pytest.mark.parametrize("name, params", [(GRID, tag.GridParams), (CONT, tag.ContinuousParams)])
def test_the_tables_declare_exactly_what_the_factories_take_and_the_defaults_fit(name, params):
    """A factory's named parameters and the EnvParams fields it passes on (all but the one it
    sets from episode_length), each with a default that passes its own check."""
    factory = tag.ENVS[name]
    defaults = {p.name: p.default for p in inspect.signature(factory).parameters.values()
                if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}
    fields = {f.name: f.default for f in dataclasses.fields(params) if f.name != "max_steps_in_episode"}
    assert set(tag.ARGS[name]) == set(defaults) | set(fields)
    for arg, value in {**fields, **defaults}.items():
        assert envs.parse_args(name, f"{arg}={value}") == {arg: value}, arg


@pytest.mark.slow
def test_valid_values_at_the_edges_build_games_that_run():
    grid, grid_params = envs.make(GRID, "num_taggers=1,grid_length=1,episode_length=1,random_start=true,"
                                        "wall_hit_penalty=-1")
    assert (grid.num_agents, grid_params.grid_length, grid_params.max_steps_in_episode) == (2, 1, 1)
    assert grid_params.wall_hit_penalty == -1.0 and isinstance(grid_params.wall_hit_penalty, float)
    cont, cont_params = envs.make(CONT, "num_taggers=1,num_runners=1,grid_length=3,use_full_observation=false,"
                                        "num_other_agents_observed=1,num_acceleration_levels=0,num_turn_levels=0,"
                                        "tagging_distance=1e-3,max_speed=2,min_turn=-3.5")
    assert cont.num_actions == 1 and cont.obs_dim == 8
    assert (cont_params.grid_length, cont_params.tagging_distance, cont_params.max_speed) == (3.0, 1e-3, 2.0)
    assert isinstance(cont_params.grid_length, float) and isinstance(cont_params.max_speed, float)
    for env, params in [(grid, grid_params), (cont, cont_params)]:
        obs = rollout(env, params)
        assert obs.shape == (8, 4, env.num_agents, env.obs_dim) and np.isfinite(obs).all()


def rollout(env, params, steps=8, games=4):
    """The observations `[steps, games, agents, obs_dim]` of random play."""
    def one(state, key):
        k_act, k_step = jax.random.split(key)
        action = jax.random.randint(k_act, (games, env.num_agents), 0, env.num_actions)
        obs, state, *_ = jax.vmap(env.step, (0, 0, 0, None))(jax.random.split(k_step, games), state, action, params)
        return state, obs

    def run(key):
        _, state = jax.vmap(env.reset, (0, None))(jax.random.split(key, games), params)
        return jax.lax.scan(one, state, jax.random.split(key, steps))[1]

    return np.asarray(jax.jit(run)(jax.random.PRNGKey(0)))


def test_a_factory_without_a_table_takes_its_named_parameters(monkeypatch):
    """The generic path another suite's factory takes: names from its signature, values any
    number or boolean; a declared probability is checked to lie in [0, 1]."""
    monkeypatch.setattr(envs.registry, "_OWN", dict(envs.registry._OWN))
    monkeypatch.setattr(envs.registry, "check_env_step", lambda *args: None)  # stand-ins, not environments

    def make_plain(size=3, *, noise=0.0, **ignored):
        return ("plain", size, noise), None

    envs.register("Plain-v0", make_plain)
    assert envs.make("Plain-v0", "size=5,noise=0.5")[0] == ("plain", 5, 0.5)
    with pytest.raises(envs.EnvError, match=r"^--env-args ignored=1: Plain-v0 takes size, noise$"):
        envs.make("Plain-v0", "ignored=1")
    with pytest.raises(envs.EnvError, match="size must be a number or a boolean"):
        envs.make("Plain-v0", "size=big")

    envs.register("Chance-v0", lambda p=0.5: (p, None), {"p": envs.Arg(float, at_least=0, at_most=1)})
    assert envs.make("Chance-v0", "p=1") == (1.0, None)
    for value, words in [("1.5", "at most 1"), ("-0.1", "at least 0"), ("nan", "finite")]:
        with pytest.raises(envs.EnvError, match=f"Chance-v0's p must be {words}"):
            envs.make("Chance-v0", f"p={value}")
