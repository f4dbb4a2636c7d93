"""`envs.register`, the extension point for a user's own environment: what it can check it
checks at once (the name, the arguments' table); what the factory returns, its required
arguments and one traced reset and step are checked when the environment is made, before a
run writes anything: one line naming the environment, exit 2, no run directory."""

import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from jaxrl_mgpu import envs

from helpers import one_error_line, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from custom_env import Corridor, make_corridor  # noqa: E402

NAME = "Bad-v0"
SMALL = ["--num-envs", "8", "--num-steps", "8", "--total-timesteps", "640", "--hidden-size", "8"]


@pytest.fixture(autouse=True)
def unregister():
    yield
    envs.registry._OWN.pop(NAME, None)
    envs.registry._made.cache_clear()


class FourValues(Corridor):
    def step_env(self, key, state, action, params):
        return super().step_env(key, state, action, params)[:4]


class VectorReward(Corridor):
    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, jnp.stack([reward, reward]), done, info


class WrongSpace(Corridor):
    def observation_space(self, params):
        from gymnax.environments import spaces
        return spaces.Box(0.0, 1.0, (3,), jnp.float32)


class DictObs(Corridor):
    def get_obs(self, state, params):
        return {"position": super().get_obs(state, params)}


class InfoList(Corridor):
    def step(self, key, state, action, params=None):
        return super().step(key, state, action, params)[:5] + ([],)


def needs_size(size):
    return make_corridor(size)


@pytest.mark.parametrize("factory, words", [
    (lambda: Corridor(), "--env Bad-v0: its factory returned a Corridor; it must return (env, env_params)"),
    (Corridor, "--env Bad-v0: its factory returned a Corridor; it must return (env, env_params)"),
    (lambda: (Corridor(), Corridor().default_params, 1), "its factory returned a tuple of 3"),
    (needs_size, "--env Bad-v0 needs size: give it with --env-args size=VALUE"),
    (lambda: (FourValues(), FourValues().default_params), "its step_env returns a tuple of 4; it must return (obs, "
                                                          "state, reward, terminated, info)"),
    (lambda: (VectorReward(), VectorReward().default_params), "its step's reward has shape (2,); it must be a scalar"),
    (lambda: (WrongSpace(), WrongSpace().default_params), "its observation space's (3,): they must agree"),
    (lambda: (InfoList(), InfoList().default_params), "its step's info is a list; it must be a dict"),
    (lambda: (DictObs(), DictObs().default_params), "its observations are dicts; they must be arrays"),
    (lambda: (object(), None), "its factory's env (object) has no reset, step, action_space, observation_space"),
])
def test_a_wrongly_registered_environment_is_one_line_before_anything_is_written(factory, words, tmp_path, capsys):
    envs.register(NAME, factory)
    assert run("--env", NAME, *SMALL, "--run-dir", str(tmp_path / "r")) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name, factory, args, words", [
    ("my:corridor", make_corridor, None, "a colon names a suite's task"),
    ("", make_corridor, None, "a non-empty string"),
    (NAME, Corridor(), None, "the factory must be callable"),
    (NAME, make_corridor, {"length": envs.Arg(int)}, "the table names 'length', which its factory does not take "
                                                     "(it takes size)"),
    (NAME, make_corridor, {"size": "int"}, "argument 'size' is 'int', not an envs.Arg"),
    (NAME, make_corridor, [("size", envs.Arg(int))], "a dict of name -> envs.Arg"),
    (NAME, needs_size, {}, "its factory requires size, which the table does not declare"),
])
def test_register_checks_the_name_and_the_table_at_once(name, factory, args, words):
    with pytest.raises(envs.EnvError, match=None) as raised:
        envs.register(name, factory, args)
    assert words in str(raised.value), raised.value
    assert name not in envs.registry._OWN


@pytest.mark.parametrize("kind", ["int", list])
def test_an_arg_of_an_unknown_kind_is_refused(kind):
    with pytest.raises(envs.EnvError, match="bool, int, float or str"):
        envs.Arg(kind)


def test_a_well_registered_environment_and_the_projects_own_pass_the_checks():
    envs.register(NAME, make_corridor, {"size": envs.Arg(int, at_least=2)})
    for name in [NAME, "CartPole-NoVel-v1", "DarkRoom", "TagGridworld-v0", "TagContinuous-v0"]:
        env, params = envs.make(name)
        envs.check_env_step(name, env, params)


# -- finding a user's environment by MODULE:NAME or an installed package's entry point -----------

def test_module_colon_name_imports_the_module_that_registers_the_name(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # `examples` imports from the root
    env, params = envs.make("examples.custom_env:Corridor-v0", "size=4")
    # (a Corridor of the module examples.custom_env, not the one this file imported as custom_env)
    assert type(env).__module__ == "examples.custom_env" and params.size == 4
    assert envs.arguments("examples.custom_env:Corridor-v0") == envs.arguments("Corridor-v0")


@pytest.mark.parametrize("name, words", [
    ("examples.custom_env:Nope-v0", "importing examples.custom_env registered no environment 'Nope-v0'"),
    ("no_such_module_x:Corridor-v0", "no suite 'no_such_module_x' (suites: atari, brax, craftax"),
])
def test_a_module_colon_name_nobody_provides_is_one_line_and_nothing_written(name, words, tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    assert run("--env", name, *SMALL, "--run-dir", str(tmp_path / "run")) == 2
    assert words in one_error_line(capsys) and not (tmp_path / "run").exists()


def test_an_installed_packages_entry_point_names_its_environment(monkeypatch):
    import importlib.metadata
    point = importlib.metadata.EntryPoint(name="Corridor-ep", value="custom_env:make_corridor",
                                          group=envs.registry.ENTRY_POINTS)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [point] if group == envs.registry.ENTRY_POINTS else [])
    try:
        env, _ = envs.make("Corridor-ep")
        assert isinstance(env, Corridor)
    finally:
        envs.registry._OWN.pop("Corridor-ep", None)
