"""Algorithms: each a module of per-device functions (ppo.py, dqn.py, ad.py, mappo.py, sac.py:
SAC and TD3) and the frozen `Spec` that says everything the host reads of it (spec.py),
registered here by name as `--algo NAME`; DQN, SAC, TD3 and AD also run as learners and
collectors on a run's store (dqn_async.py, sac_async.py over replay_async.py; ad_async.py:
their specs' `asynchronous`). Adding one is a module and a `register` call (docs/algorithms.md);
`for_run(name, env)` is the spec a run trains with (PPO on a multi-agent game is multi-agent
PPO), chosen once, in the run's plan (plan.py)."""

import dataclasses

from jaxrl_mgpu.algos.ad import ad
from jaxrl_mgpu.algos.ad import asynchronous as ad_async
from jaxrl_mgpu.algos.dqn import dqn
from jaxrl_mgpu.algos.dqn import asynchronous as dqn_async
from jaxrl_mgpu.algos.mappo import mappo
from jaxrl_mgpu.algos.ppo import ppo
from jaxrl_mgpu.algos.sac import sac
from jaxrl_mgpu.algos.sac import asynchronous as sac_async
from jaxrl_mgpu.algos.spec import Asynchronous, Spec, for_run, get, names, register

register("ppo", dataclasses.replace(ppo.SPEC, multi_agent=mappo.SPEC))
register("dqn", dataclasses.replace(dqn.SPEC, asynchronous=dqn_async.ASYNCHRONOUS))
register("ad", dataclasses.replace(ad.SPEC, asynchronous=ad_async.ASYNCHRONOUS))
register("sac", dataclasses.replace(sac.SAC, asynchronous=sac_async.ASYNCHRONOUS))
register("td3", dataclasses.replace(sac.TD3, asynchronous=sac_async.ASYNCHRONOUS))

__all__ = ["Asynchronous", "Spec", "for_run", "get", "names", "register"]
