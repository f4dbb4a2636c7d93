"""What the host reads of SAC and TD3 (algos/spec.py): two algorithms over shared parts, each
with its options (options.py), the per-device functions (sac.py) and the asynchronous learner and
collectors (asynchronous.py); registered as `--algo sac` and `--algo td3`."""

from jaxrl_mgpu.algos.replay import AUTO_SCALE_KEEPS, steady_state, steps_per_update
from jaxrl_mgpu.algos.sac import asynchronous, options, sac
from jaxrl_mgpu.algos.spec import Spec

_SHARED = dict(check=sac.check, algorithm=sac.algorithm, policy=sac.policy, steps_per_update=steps_per_update,
               steady_state=steady_state, auto_scale_keeps=AUTO_SCALE_KEEPS, asynchronous=asynchronous.ASYNCHRONOUS)
SAC = Spec(options=options.SAC, console=(("critic", "loss/critic", ".3f"), ("alpha", "alpha", ".3f")), **_SHARED)
TD3 = Spec(options=options.TD3, console=(("critic", "loss/critic", ".3f"), ("q", "loss/q_mean", ".1f")), **_SHARED)
