"""plan.py: a run resolved once into config, environment, spec, devices, runs and split."""


import jax
import pytest

from jaxrl_mgpu import algos, parallel, plan as plan_lib
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu.algos.base import BatchSplit, Share
from jaxrl_mgpu.chunks import Trainer
from jaxrl_mgpu.cli import ConfigError, UserError


def resolved(**options):
    given = config_lib.given_from(options)
    return plan_lib.resolve(config_lib.build(given), given)


def small(**overrides):
    return config_lib.validate(config_lib.build(overrides))


def test_an_unknown_algorithm_is_one_line_naming_the_registered_ones():
    with pytest.raises(ConfigError) as raised:
        resolved(algo="a2cc")
    assert str(raised.value) == ("--algo a2cc: no such algorithm; choose from " + ", ".join(algos.names())
                                 + ", or MODULE:NAME of a module that registers NAME")


def test_ppo_on_a_multi_agent_game_is_multi_agent_ppo_chosen_in_the_plan():
    plain = plan_lib.of_config(small(env="CartPole-v1"))
    game = plan_lib.of_config(small(env="TagGridworld-v0", num_envs=8))
    assert plain.spec is algos.get("ppo") and game.spec is algos.get("ppo").multi_agent


def test_the_split_is_the_spec_s_over_the_data_devices():
    plan = plan_lib.on_devices(small(num_envs=16, num_steps=8, num_minibatches=2), parallel.setup("pmap", 4))
    assert plan.split.environments == Share(16, 4) and plan.split.minibatch == Share(64, 16)
    with pytest.raises(UserError, match="--num-envs 6 is not divisible by 4 devices"):
        plan_lib.on_devices(small(num_envs=6), parallel.setup("pmap", 4))


def test_parameter_shapes_come_without_building_the_algorithm_and_match_it():
    plan = plan_lib.on_devices(small(num_envs=8, hidden_size=24), parallel.setup("pmap", 1))
    built = Trainer(plan).init_state().params  # on the devices: a leading device axis
    assert jax.tree.map(lambda x: (x.shape, x.dtype), plan.params_shapes()) == \
        jax.tree.map(lambda x: (x.shape[1:], x.dtype), built)


def test_a_mode_the_algorithm_has_not_is_refused_naming_those_that_have_it():
    with pytest.raises(ConfigError) as raised:
        plan_lib.on_devices(small(mode="learn", run_dir="r"), parallel.setup("pmap", 1))
    assert "--mode learn: --algo ppo runs only as --mode both (learners and collectors: --algo dqn, ad, sac, td3)" in str(raised.value)


def test_a_registered_spec_must_be_a_spec():
    with pytest.raises(ConfigError, match="algos.Spec, not a dict"):
        algos.register("mine", {"check": None})
    assert "mine" not in algos.names()


def test_a_split_is_read_by_name():
    split = BatchSplit(2, environments=Share(8, 4))
    assert split.rows() == {"environments": (8, 4)}
